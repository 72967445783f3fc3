"""Asymmetric (zero-point) quantization.

s = (max(w, 0) - min(w, 0)) / (2^b - 1), z = round(-min(w, 0) / s), q = clamp(round(w / s) + z, 0, 2^b - 1),
w_hat = (q - z) s.  The range includes 0, so zero is exact and an all-zero group gives zeros.
Invariant: |w - w_hat| <= s / 2 (the rounding of z shifts the grid by < s/2 and the clamp only trims
values within s/2 of the ends).  Absmax round trips do not hold.  Jacob et al. 2018, section 2.1;
Nagel et al. 2021, section 2.2 (asymmetric quantization).
"""

import torch

from llm_inference_harness.contracts.quantization import Quantized, check_inputs, scale_shape
from llm_inference_harness.engine.registry import register


@register("quantization", "zeropoint", devices=("cpu", "cuda"), dtypes=("float64", "float32"), exact=False,
          cite="Jacob et al. 2018, section 2.1", caps={"symmetric": False})
def zeropoint(w, *, bits, granularity="channel", group_size=None, range_first=False):
    check_inputs(w, bits, granularity, group_size)
    rows, cols = w.shape
    wg = w.reshape(*scale_shape(w, granularity, group_size), -1)  # (R, G, elements per scale)
    lo, hi = wg.amin(dim=-1).clamp(max=0), wg.amax(dim=-1).clamp(min=0)  # (R, G)
    levels = 2**bits - 1
    s = (hi - lo) / levels if range_first else hi / levels - lo / levels  # hi - lo overflows near the dtype's max
    safe = torch.where(s > 0, s, torch.ones_like(s))
    z = torch.round(-lo / safe)  # (R, G), in [0, 2^b - 1]
    q = (torch.round(wg / safe[..., None]) + z[..., None]).clamp(0, 2**bits - 1)  # (R, G, g)
    return Quantized(q.reshape(rows, cols).to(torch.uint8), s, z.to(torch.uint8))
