"""Symmetric absmax quantization through PyTorch's own fake-quantization kernel.

The scales are absmax / (2^(b-1) - 1) as in the reference; rounding and clamping are done by
`torch.fake_quantize_per_channel_affine` (round half to even, clamp to [-(2^(b-1) - 1), 2^(b-1) - 1]),
an implementation written independently of ours.  Groups are handled as channels of a (rows * G, g)
view.  Invariant: |w - q s| <= s / 2.  Jacob et al. 2018, "Quantization and Training of Neural
Networks for Efficient Integer-Arithmetic-Only Inference", section 2.1.
"""

import torch

from llm_inference_harness.contracts.quantization import Quantized, check_inputs, qmax
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.quantization.absmax import absmax_scale


@register("quantization", "torch_fake_quant", devices=("cpu", "cuda"), dtypes=("float32",), exact=False,
          cite="Jacob et al. 2018, section 2.1 (PyTorch fake_quantize_per_channel_affine)", caps={"symmetric": True})
def torch_fake_quant(w, *, bits, granularity="channel", group_size=None):
    check_inputs(w, bits, granularity, group_size)
    rows, cols = w.shape
    s = absmax_scale(w, bits, granularity, group_size)  # (R, G)
    R, G = s.shape
    channels = w.reshape(rows * G, cols // G)  # (rows * G, g): one fake-quant channel per scale
    per_channel = s.expand(rows, G).reshape(rows * G)  # (rows * G,)
    safe = torch.where(per_channel > 0, per_channel, torch.ones_like(per_channel))
    zero_points = torch.zeros(rows * G, dtype=torch.int32, device=w.device)
    fq = torch.fake_quantize_per_channel_affine(channels, safe, zero_points, 0, -qmax(bits), qmax(bits))
    return Quantized(torch.round(fq / safe[:, None]).reshape(rows, cols).to(torch.int8), s)
