"""W8A8 per-token linear layer emulated in float64: the integer products of the codes summed in float64.

The codes are whole numbers below 2^7 in magnitude, so every product and every partial sum (< 2^53) is
exact in float64: the emulation is bit-for-bit the integer accumulation, and it runs on any device.
A token (row) of x that is all zero -- padding -- has scale 0 and must give codes 0, not 0 / 0 = NaN.
Xiao et al. 2023, "SmoothQuant", appendix (fake quantization, per-token dynamic scales).
"""

import torch

from llm_inference_harness.contracts.quantization import qmax
from llm_inference_harness.contracts.quantized_linear import check_inputs, no_tokens_output
from llm_inference_harness.engine.registry import register


def codes_f64(t: torch.Tensor, bits: int, guard_zero: bool = True):
    """Per-row absmax codes as float64 integers and their scales (rows, 1)."""
    t = t.double()
    s = t.abs().amax(dim=-1, keepdim=True) / qmax(bits)  # (rows, 1)
    divisor = torch.where(s > 0, s, torch.ones_like(s)) if guard_zero else s
    return torch.round(t / divisor).clamp(-qmax(bits), qmax(bits)), s


def w8a8_emulated(x, w, *, bits=8, calib=None, guard_zero=True):
    check_inputs(x, w, bits, calib)
    if (empty := no_tokens_output(x, w)) is not None:
        return empty
    qx, sx = codes_f64(x.reshape(-1, x.shape[-1]), bits, guard_zero)  # (n, in), (n, 1)
    qw, sw = codes_f64(w, bits)  # (out, in), (out, 1)
    y = (qx @ qw.T) * sx * sw.T  # (n, out): exact integer sums, then two roundings
    return y.to(x.dtype).reshape(*x.shape[:-1], w.shape[0])  # (..., out)


register("quantized_linear", "w8a8_token_f64", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
         exact=False, cite="Xiao et al. 2023, SmoothQuant, appendix", caps={"weight": "channel", "act": "token"})(
    lambda x, w, *, bits=8, calib=None: w8a8_emulated(x, w, bits=bits, calib=calib))
