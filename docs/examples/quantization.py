"""Symmetric absmax quantization per tensor, per row or per group of columns: a plugin for the quantization
contract (harness/contracts/quantization.py).  s = max|w| / (2^(b-1) - 1), q = round(w / s).

    harness check quantization --plugin docs/examples/quantization.py:quantize
"""

import torch

from llm_inference_harness import declare
from llm_inference_harness.contracts.quantization import Quantized, check_inputs, qmax


@declare(dtypes=("float32", "float64"), devices=("cpu",))
def quantize(w, *, bits, granularity="channel", group_size=None):
    g = check_inputs(w, bits, granularity, group_size)  # columns per scale; ValueError naming the argument
    rows, cols = w.shape
    blocks = w.reshape(1, 1, rows * cols) if granularity == "tensor" else w.reshape(rows, cols // g, g)  # (R, G, n)
    s = blocks.abs().amax(dim=-1) / qmax(bits)  # (R, G)
    safe = torch.where(s > 0, s, 1)[..., None]  # an all-zero group: codes 0, scale 0, no 0 / 0
    codes = torch.round(blocks / safe).clamp(-qmax(bits), qmax(bits))  # (R, G, n)
    return Quantized(codes.reshape(rows, cols).to(torch.int8), s)
