"""Symmetric absmax quantization, the reference quantizer.

s = max|w| / (2^(b-1) - 1) over each tensor / row / group of g columns, q = round(w / s).
Invariant: |w - q s| <= s / 2 and the absmax element maps to +-(2^(b-1) - 1) exactly; an all-zero
group keeps s = 0 and q = 0 (the division is guarded, so no NaN).
Dettmers et al. 2022, "LLM.int8()", section 2 (absmax quantization); Nagel et al. 2021, "A White
Paper on Neural Network Quantization", section 2.2.
"""

import torch

from llm_inference_harness.contracts.quantization import Quantized, check_inputs, qmax
from llm_inference_harness.engine.registry import register


def absmax_scale(w: torch.Tensor, bits: int, granularity: str, group_size: int | None = None) -> torch.Tensor:
    """Scales of shape (R, G) (see the contract) for a 2-d w."""
    g = check_inputs(w, bits, granularity, group_size)  # before unpacking: a 1-d w gets the contract's error
    rows, cols = w.shape
    if granularity == "tensor":
        return (w.abs().amax() / qmax(bits)).reshape(1, 1)  # (1, 1)
    return w.reshape(rows, cols // g, g).abs().amax(dim=-1) / qmax(bits)  # (rows, G)


def quantize_absmax(w: torch.Tensor, bits: int = 8, granularity: str = "channel",
                    group_size: int | None = None) -> Quantized:
    """Codes (int8) and scales; importable building block (the int8 KV cache and the linear layers use it)."""
    s = absmax_scale(w, bits, granularity, group_size)  # (R, G); validates w first
    rows, cols = w.shape
    G = s.shape[1]
    safe = torch.where(s > 0, s, torch.ones_like(s))[:, :, None]  # all-zero group: 0 / 1 = 0, not 0 / 0
    q = torch.round(w.reshape(rows, G, cols // G) / safe).clamp(-qmax(bits), qmax(bits))  # (rows, G, g)
    return Quantized(q.reshape(rows, cols).to(torch.int8), s)


@register("quantization", "absmax", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
          exact=False, cite="Dettmers et al. 2022, LLM.int8(), section 2", caps={"symmetric": True})
def absmax(w, *, bits, granularity="channel", group_size=None):
    return quantize_absmax(w, bits, granularity, group_size)
