"""W8A8 linear layer with integer matmul: int8 codes of x and w, int32 accumulation, then rescaling.

x is quantized at run time with one absmax scale per tensor or per token (row), w with one per output
channel: y_ij = s^x_i s^w_j sum_k q^x_ik q^w_jk.  The sum is exact in int32 (|q| <= 127, so it cannot
overflow below 2^31 / 127^2 = 133k input features); the result equals the dequantized float
computation up to the rounding of the two final products.
Dettmers et al. 2022, "LLM.int8()", section 3.1 (vector-wise quantization); Xiao et al. 2023,
"SmoothQuant", section 2 (per-tensor vs per-token).
"""

import torch

from llm_inference_harness.contracts.quantized_linear import check_inputs, no_tokens_output
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.quantization.absmax import quantize_absmax


def int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (n, k) int8 @ b (m, k).T int8 -> (n, m) int32, exact."""
    if a.device.type == "cpu":
        return a.to(torch.int32) @ b.to(torch.int32).T  # (n, m)
    # CUDA has no general int32 matmul; products of int8 codes summed in float64 are exact below 2^53.
    return (a.double() @ b.double().T).to(torch.int32)  # (n, m)


def w8a8_linear(x, w, *, bits=8, calib=None, act="token"):
    check_inputs(x, w, bits, calib)
    if (empty := no_tokens_output(x, w)) is not None:
        return empty
    x2 = x.reshape(-1, x.shape[-1])  # (n, in)
    qx = quantize_absmax(x2, bits, "channel" if act == "token" else "tensor")  # scales (n, 1) or (1, 1)
    qw = quantize_absmax(w.to(x.dtype), bits, "channel")  # scales (out, 1)
    acc = int_matmul(qx.codes, qw.codes)  # (n, out) int32
    y = acc.to(x.dtype) * qx.scale * qw.scale.T  # (n, out)
    return y.reshape(*x.shape[:-1], w.shape[0])  # (..., out)


for _act in ("tensor", "token"):
    register("quantized_linear", f"w8a8_{_act}", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
             exact=False, cite="Dettmers et al. 2022, LLM.int8(), section 3.1",
             caps={"weight": "channel", "act": _act})(
        lambda x, w, *, bits=8, calib=None, _act=_act: w8a8_linear(x, w, bits=bits, calib=calib, act=_act))
