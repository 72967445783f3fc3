"""The quantizer contract.

    quantize(w, *, bits: int, granularity: str = "channel", group_size: int | None = None) -> Quantized

* w: a finite floating-point matrix (rows, cols): a Linear weight (out, in), or activations
  (tokens, features), where per-"channel" means per token.
* bits in 2..8.  granularity: "tensor" (one scale), "channel" (one scale per row) or "group" (one
  scale per run of ``group_size`` consecutive elements of a row; ``group_size`` divides cols).
* Returns ``Quantized(codes, scale, zero)``: integer ``codes`` of w's shape; ``scale`` of w's dtype
  with shape (R, G): (1, 1) per tensor, (rows, 1) per channel, (rows, cols // group_size) per group;
  ``zero`` is None (symmetric) or an integer tensor of scale's shape (asymmetric, zero point).
* `dequantize(qt)` is the contract's own: w_hat = (codes - zero) * scale, group by group.

Symmetric absmax is the reference: s = max|w| / (2^(b-1) - 1), q = round(w / s), codes in
[-(2^(b-1) - 1), 2^(b-1) - 1].  round is to nearest; an exact tie may go either way (torch.round's
half-to-even or C's roundf, away from zero): both keep every error within half a step.  An asymmetric
implementation declares ``caps={"symmetric": False}``:
s = (max(w, 0) - min(w, 0)) / (2^b - 1), z = round(-min(w, 0) / s), codes in [0, 2^b - 1]; the
absmax round trip does not apply to it, the other properties do.  An all-zero group has scale 0
(or any finite scale) and codes 0: it dequantizes to zeros, never NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from harness.capabilities import Caps, cap
from harness.contracts import Technique, define
from harness.guard import ContractViolation, call_limit, check_tensor, guarded_call
from harness.registry import Impl


@dataclass(frozen=True)
class QuantizationCaps(Caps):
    symmetric: bool = cap(True, "absmax codes in -(2^(b-1)-1)..2^(b-1)-1; False: zero point, codes in 0..2^b-1")

QUANTIZATION = define(
    Technique(
        name="quantization",
        signature='quantize(w, *, bits: int, granularity: str = "channel", group_size: int | None = None)'
        " -> Quantized(codes, scale, zero)",
        summary="b-bit (2-8) integer codes and scales per tensor / channel / group; dequantize(qt) inverts",
        properties=("properties.test_quantization",),
        reference="absmax",
        caps=QuantizationCaps,
    )
)
GRANULARITIES = ("tensor", "channel", "group")


class Quantized(NamedTuple):
    codes: torch.Tensor  # (rows, cols) integers
    scale: torch.Tensor  # (R, G), w's dtype: R in {1, rows}, G in {1, cols // group_size}
    zero: torch.Tensor | None = None  # (R, G) integers, asymmetric only


def qmax(bits: int) -> int:
    """Largest symmetric code, 2^(b-1) - 1: the range stays symmetric, so -w quantizes to -q."""
    return 2 ** (bits - 1) - 1


def check_inputs(w: torch.Tensor, bits: int, granularity: str, group_size: int | None) -> int:
    """Validate a quantize call; return the number of columns per scale. ValueError names the argument."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"quantize: w must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"quantize: w must be a 2-d floating-point tensor, got {w.dtype} of shape {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("quantize: w holds NaN or inf values; quantization needs finite weights")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"quantize: bits must be an integer in 2..8, got {bits!r}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"quantize: granularity must be one of {GRANULARITIES}, got {granularity!r}")
    cols = w.shape[1]
    if granularity != "group":
        if group_size is not None:
            raise ValueError(f"quantize: group_size is only for granularity='group', got {group_size!r}")
        return cols
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or cols % group_size:
        raise ValueError(f"quantize: group_size must be a positive divisor of w's {cols} columns, got {group_size!r}")
    return group_size


def scale_shape(w: torch.Tensor, granularity: str, group_size: int | None) -> tuple[int, int]:
    rows, cols = w.shape
    return {"tensor": (1, 1), "channel": (rows, 1), "group": (rows, cols // (group_size or 1))}[granularity]


def dequantize(qt: Quantized) -> torch.Tensor:
    """(codes - zero) * scale, each scale applied to its own run of columns of its row (or to all rows)."""
    rows, cols = qt.codes.shape
    R, G = qt.scale.shape
    codes = qt.codes.to(qt.scale.dtype).reshape(rows, G, cols // G)  # (rows, G, g)
    if qt.zero is not None:
        codes = codes - qt.zero.to(qt.scale.dtype)[:, :, None]
    return (codes * qt.scale[:, :, None]).reshape(rows, cols)  # (R or rows, G, 1) broadcast -> (rows, cols)


def step_per_element(qt: Quantized) -> torch.Tensor:
    """The quantization step s that applies to each element of w, as a (rows, cols) tensor."""
    rows, cols = qt.codes.shape
    G = qt.scale.shape[1]
    return qt.scale[:, :, None].expand(rows, G, cols // G).reshape(rows, cols)  # (rows, cols)


def code_range(bits: int, symmetric: bool) -> tuple[int, int]:
    return (-qmax(bits), qmax(bits)) if symmetric else (0, 2**bits - 1)


def call(impl: Impl, w: torch.Tensor, *, bits: int, granularity: str, group_size: int | None = None) -> Quantized:
    """Call a quantizer under guard and check the promised output (shapes, dtypes, finite scales)."""
    out = guarded_call(impl.fn, w, bits=bits, granularity=granularity, group_size=group_size, arg_names=("w",),
                       timeout_s=call_limit(impl))
    if not (isinstance(out, tuple) and len(out) in (2, 3)):
        got = f"a {type(out).__name__} of {len(out)}" if isinstance(out, tuple) else type(out).__name__
        raise ContractViolation(f"{impl.name}: returned {got}, expected Quantized(codes, scale, zero)")
    qt = Quantized(*out)
    check_tensor(qt.codes, what=f"{impl.name} codes", shape=tuple(w.shape), device=w.device)
    if qt.codes.is_floating_point() or qt.codes.is_complex():
        raise ContractViolation(f"{impl.name} codes: dtype {qt.codes.dtype}, expected an integer dtype")
    check_tensor(qt.scale, what=f"{impl.name} scale", shape=scale_shape(w, granularity, group_size), dtype=w.dtype,
                 device=w.device)
    if qt.zero is not None:
        check_tensor(qt.zero, what=f"{impl.name} zero", shape=tuple(qt.scale.shape), device=w.device)
        if qt.zero.is_floating_point() or qt.zero.is_complex():  # a fractional zero point cannot map 0 exactly
            raise ContractViolation(f"{impl.name} zero: dtype {qt.zero.dtype}, expected an integer dtype")
    if bool((qt.scale < 0).any()):
        raise ContractViolation(f"{impl.name} scale: negative scale {qt.scale.min().item():.3g}")
    return qt


def bits_per_weight(bits: int, cols: int, granularity: str, group_size: int | None, rows: int,
                    scale_bits: int = 16, zero_point: bool = False) -> float:
    """Storage cost including the scales (and zero points): b + scale_bits / g for groups of g."""
    per_scale = scale_bits + (bits if zero_point else 0)
    scales = {"tensor": 1, "channel": rows, "group": rows * cols // (group_size or 1)}[granularity]
    return bits + per_scale * scales / (rows * cols)


def snr_db(signal_var: float, step: float) -> float:
    """Signal-to-quantization-noise ratio of uniform rounding: noise variance step^2 / 12."""
    return 10 * math.log10(signal_var / (step**2 / 12))
