"""Float64 oracles of quantizers: symmetric absmax (in each declared code-range convention) and zero-point."""

from __future__ import annotations

import torch

from llm_inference_harness.contracts.quantization import Quantized, code_range, qmax, scale_divisor, scale_shape


def quantize64(w: torch.Tensor, bits: int, granularity: str, group_size: int | None = None) -> Quantized:
    """Symmetric absmax from the definition, in float64: s = max|w| / (2^(b-1) - 1), q = round(w / s)."""
    w = w.double()
    rows, cols = w.shape
    blocks = w.reshape(*scale_shape(w, granularity, group_size), -1)  # (R, G, elements per scale)
    s = blocks.abs().amax(dim=-1) / qmax(bits)  # (R, G)
    q = torch.where(s[..., None] > 0, blocks / s[..., None], 0.0).round()
    return Quantized(q.reshape(rows, cols).to(torch.int64), s)


def zero_point_quantize64(w: torch.Tensor, bits: int, granularity: str, group_size: int | None = None) -> Quantized:
    """Asymmetric quantization from the contract's definition, in float64: s = (max(w, 0) - min(w, 0)) /
    (2^b - 1) and z = round(-min(w, 0) / s) per group (z = 0 where s = 0), codes clamp(round(w / s) + z)."""
    w = w.double()
    rows, cols = w.shape
    blocks = w.reshape(*scale_shape(w, granularity, group_size), -1)  # (R, G, elements per scale)
    lo, hi = blocks.amin(dim=-1).clamp(max=0), blocks.amax(dim=-1).clamp(min=0)  # (R, G)
    s = (hi - lo) / (2**bits - 1)
    safe = torch.where(s > 0, s, 1.0)
    z = torch.round(-lo / safe)  # (R, G)
    q = (torch.round(blocks / safe[..., None]) + z[..., None]).clamp(0, 2**bits - 1)  # (R, G, elements per scale)
    return Quantized(q.reshape(rows, cols).to(torch.int64), s, z.to(torch.int64))


def declared_quantize64(w: torch.Tensor, bits: int, granularity: str, group_size: int | None, caps) -> Quantized:
    """A symmetric quantizer's format as ``caps`` declares it, in float64: s = max|w| / divisor (restricted,
    full) or extreme / -divisor (signed_extreme), floored at caps.scale_floor; q = clamp(round(w / s)).
    The scale is the unrounded one: a declared scale_dtype's rounding is the properties' allowance."""
    w = w.double()
    rows, cols = w.shape
    blocks = w.reshape(*scale_shape(w, granularity, group_size), -1)  # (R, G, elements per scale)
    divisor = scale_divisor(bits, caps.code_range)
    if caps.code_range == "signed_extreme":
        peak = blocks.gather(-1, blocks.abs().argmax(dim=-1, keepdim=True))[..., 0]  # (R, G): signed extreme
        s = peak / -divisor
    else:
        s = blocks.abs().amax(dim=-1) / divisor  # (R, G)
    s = torch.where(s.abs() < caps.scale_floor, torch.full_like(s, caps.scale_floor), s)
    lo, hi = code_range(bits, True, caps.code_range)
    q = torch.where(s[..., None] != 0, blocks / s[..., None], 0.0).round().clamp(lo, hi)  # (R, G, g)
    return Quantized(q.reshape(rows, cols).to(torch.int64), s)


def float_zero_point_quantize64(w: torch.Tensor, bits: int, granularity: str, group_size: int | None = None,
                                edge: bool = False, floor: float = 0.0) -> Quantized:
    """Asymmetric quantization with a floating-point zero point (``zero_point="float"``), in float64: over the
    group's own range, s = (max(w) - min(w)) / (2^b - 1) and z = -min(w) / s (z = 0 where s = 0: an all-zero, or
    constant, group), codes clamp(round(w / s + z), 0, 2^b - 1); w_hat = (q - z) s.  ``edge`` (float_edge, MLX):
    the end e of larger magnitude made exact, s = e / round(e / s0) with s0 signed so that e / s0 <= 0, z = -e / s.
    ``floor``: a declared scale_floor, s = max(s, floor) where the group is not all zero (HQQ's 5e-5)."""
    w = w.double()
    rows, cols = w.shape
    blocks = w.reshape(*scale_shape(w, granularity, group_size), -1)  # (R, G, elements per scale)
    lo, hi = blocks.amin(dim=-1), blocks.amax(dim=-1)  # (R, G)
    s = (hi - lo) / (2**bits - 1)
    s = torch.where((s < floor) & (hi - lo > 0), torch.full_like(s, floor), s)
    base = lo
    if edge:
        low_end = lo.abs() > hi.abs()
        e, s0 = torch.where(low_end, lo, hi), torch.where(low_end, s, -s)  # (R, G): e / s0 <= 0
        q0 = torch.round(e / torch.where(s0 != 0, s0, 1.0))
        s, base = torch.where(q0 != 0, e / torch.where(q0 != 0, q0, 1.0), s0), torch.where(q0 != 0, e, 0.0)
    safe = torch.where(s != 0, s, 1.0)
    z = torch.where(s != 0, -base / safe, 0.0)  # (R, G)
    q = torch.where(s[..., None] != 0, torch.round(blocks / safe[..., None] + z[..., None]), 0.0)  # (R, G, g)
    return Quantized(q.clamp(0, 2**bits - 1).reshape(rows, cols).to(torch.int64), s, z)
