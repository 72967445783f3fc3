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

Symmetric absmax is the reference and the default format: s = max|w| / (2^(b-1) - 1), q = round(w / s),
codes in [-(2^(b-1) - 1), 2^(b-1) - 1] (``code_range="restricted"``), scales stored in w's dtype, any bit
width 2..8, any granularity and group size.  round is to nearest; an exact tie may go either way
(torch.round's half-to-even or C's roundf, away from zero): both keep every error within half a step.
An asymmetric implementation declares ``caps={"symmetric": False}``:
s = (max(w, 0) - min(w, 0)) / (2^b - 1), z = round(-min(w, 0) / s), codes in [0, 2^b - 1]; the
absmax round trip does not apply to it, the other properties do.  An all-zero group has scale 0
(or any finite scale) and codes 0: it dequantizes to zeros, never NaN.

A library's format may differ from the default; it declares how (`QuantizationCaps`), the properties then
draw only inside what it declares, and skip, naming the format, what needs more:

* ``bits``, ``granularities``, ``group_sizes``: the formats it serves (GGUF Q8_0: 8 bits, groups of 32).
* ``code_range="full"``: codes in [-2^(b-1), 2^(b-1) - 1] with s = max|w| / (2^(b-1) - 1/2) (torchao's
  symmetric int8, torch.ao's qint8 observers: absmax / 127.5).  Every error is still within s/2; the
  absmax element no longer round-trips (a positive one gets 2^(b-1) - 1, half a step short; a negative one
  -2^(b-1), or -(2^(b-1) - 1) where w / s rounds just short of the tie).
* ``code_range="signed_extreme"``: s = m / -2^(b-1) for m the group's element of largest magnitude (where +m and
  -m tie, the first in the row's order, as llama.cpp's `amax < fabsf(v)` keeps it), so s takes m's opposite sign
  and m gets code -2^(b-1) exactly (GGUF Q4_0, d = max / -8); an element past 2^(b-1) - 1/2 steps on the other
  side (the other of a +m, -m tie among them) is clipped to 2^(b-1) - 1 and may be off by one whole step.
* ``scale_dtype``: the scales are returned in w's dtype but hold values of a narrower dtype (GGUF stores
  d as float16): the codes were computed with the unrounded s, so the error bound is
  (|s| + r) / 2 + |q| r, r = half the spacing of scale_dtype at s, and the round trips are off by |q| r.
* ``scale_floor``: no scale is smaller than this (torch.ao's observers floor it at float32's eps): the
  reference scale is then max(rule, floor), and the absmax round trip is not expected where it binds.
* ``excluded_group_sizes``: group sizes the format refuses although they divide the columns (MLX serves only
  32, 64 and 128; MatMulNBits' blocks are powers of two from 16): never drawn, and refused naming group_size.
* ``zero_point="float"`` (asymmetric only): the zero point is a real number, not a code (HQQ, optimum-quanto's
  int4 shift, MLX's bias): s = (max(w) - min(w)) / (2^b - 1) over the group's own range (0 need not be in it,
  nor on the grid) and z = -min(w) / s, returned as a floating-point tensor in code units, so that
  w_hat = (q - z) s as for an integer one.  An all-zero group still dequantizes to zeros.
  ``zero_point="float_edge"`` (MLX's affine mode): the same, but the group's end of larger magnitude e is made
  exact, s = e / round(e / s0) with s0 = (max - min) / (2^b - 1) signed so that e / s0 <= 0, and z = -e / s:
  s may be negative (the codes then count down from e), and the other end may fall up to a step short.

What stays exact under every declaration: codes in the declared range, the error bound, the absmax scale
rule of the declared convention, requantization being the identity (not in the full convention, whose
positive peak dequantizes half a step short), rescaling by a power of two, zeros staying zeros, and the
bad-input rules: w must be a non-empty 2-d floating-point tensor of finite values (an empty w, e.g. 0 x 8,
raises ValueError naming w), a format it does not declare is refused naming the argument; codes, scales and
zero points come back on w's device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

import torch

from llm_inference_harness.contracts import Rule, Technique, define
from llm_inference_harness.engine.capabilities import Caps, cap
from llm_inference_harness.engine.guard import ContractViolation, call_limit, check_tensor, guarded_call

if TYPE_CHECKING:  # the registry imports the contracts: they name its record for type checking only
    from llm_inference_harness.engine.registry import Impl

CodeRange = Literal["restricted", "full", "signed_extreme"]
GRANULARITIES = ("tensor", "channel", "group")
SCALE_DTYPES = ("float64", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class QuantizationCaps(Caps):
    symmetric: bool = cap(True, "absmax codes in -(2^(b-1)-1)..2^(b-1)-1; False: zero point, codes in 0..2^b-1")
    bits: tuple[int, ...] = cap((2, 3, 4, 5, 6, 7, 8), "the bit widths it serves")
    granularities: tuple[str, ...] = cap(GRANULARITIES, "the granularities it serves")
    group_sizes: tuple[int, ...] | None = cap(None, "the group sizes it serves (None: any divisor of the columns)")
    code_range: CodeRange = cap("restricted", "symmetric codes: restricted +-(2^(b-1)-1), s = absmax/(2^(b-1)-1); "
                                              "full -2^(b-1)..2^(b-1)-1, s = absmax/(2^(b-1)-1/2); signed_extreme: "
                                              "s = extreme/-2^(b-1), the extreme at -2^(b-1) (GGUF Q4_0)")
    scale_dtype: str | None = cap(None, "the dtype whose values the scales hold (GGUF: float16); None: w's dtype")
    scale_floor: float = cap(0.0, "no scale is below this (torch.ao observers: float32 eps)")
    excluded_group_sizes: tuple[int, ...] = cap((), "group sizes it refuses although they divide the columns "
                                                    "(MLX: all but 32, 64, 128)")
    zero_point: Literal["integer", "float", "float_edge"] = cap(
        "integer", "asymmetric: an integer code z with the range widened to hold 0; float: z = -min/s over the "
                   "group's own range (HQQ, quanto int4); float_edge: the larger end made exact (MLX)")

    def __post_init__(self) -> None:
        """A declaration no property could read rightly is refused, naming the capability."""
        if not self.bits or not set(self.bits) <= set(range(2, 9)):
            raise ValueError(f"quantization: capability bits must be widths among 2..8, got {self.bits!r}")
        if not self.granularities or not set(self.granularities) <= set(GRANULARITIES):
            raise ValueError(f"quantization: capability granularities must be among {GRANULARITIES}, "
                             f"got {self.granularities!r}")
        if self.group_sizes is not None and (not self.group_sizes or min(self.group_sizes) < 1):
            raise ValueError(f"quantization: capability group_sizes must be positive sizes, got {self.group_sizes!r}")
        if self.code_range != "restricted" and not self.symmetric:
            raise ValueError(f"quantization: capability code_range={self.code_range!r} is for symmetric quantizers")
        if self.scale_dtype is not None and self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(f"quantization: capability scale_dtype must be one of {SCALE_DTYPES}, "
                             f"got {self.scale_dtype!r}")
        if self.zero_point != "integer" and self.symmetric:
            raise ValueError(f"quantization: capability zero_point={self.zero_point!r} is for asymmetric quantizers "
                             "(symmetric=False)")
        if self.excluded_group_sizes and (self.group_sizes is not None or min(self.excluded_group_sizes) < 1):
            raise ValueError("quantization: capability excluded_group_sizes takes positive sizes, and only where "
                             "group_sizes is None (an explicit list excludes the rest), got "
                             f"{self.excluded_group_sizes!r}")
        if not (math.isfinite(self.scale_floor) and self.scale_floor >= 0):
            raise ValueError(f"quantization: capability scale_floor must be finite and >= 0, got {self.scale_floor!r}")


QUANTIZATION = define(
    Technique(
        name="quantization",
        signature='quantize(w, *, bits: int, granularity: str = "channel", group_size: int | None = None)'
        " -> Quantized(codes, scale, zero)",
        summary="b-bit (2-8) integer codes and scales per tensor / channel / group; dequantize(qt) inverts",
        properties=("llm_inference_harness.properties.test_quantization",),
        reference="absmax",
        caps=QuantizationCaps,
        rules=(
            Rule("half step", "every element dequantizes within half a step of its own group's scale",
                 ("error_within_half_step", "worked_example_4bit", "long_rows_keep_their_peak", "extreme_magnitudes",
                  "granularity_bounds_nest")),
            Rule("format", "codes lie in the declared range and scales (and zero points) follow the declared "
                           "format's formula",
                 ("codes_in_range", "absmax_round_trips", "zero_point_scales_match_reference", "worked_example_4bit")),
            Rule("grid", "quantizing is idempotent and scale-equivariant: q(dq(q(w))) = q(w), q(c w) has c times the "
                         "scales", ("requantize_is_identity", "positive_rescaling")),
            Rule("zeros", "an all-zero group has a finite scale and codes that dequantize to exactly 0, never NaN",
                 ("all_zero_groups_give_zeros",)),
            Rule("bad input", "bits, group sizes and weights that break the contract raise ValueError/TypeError "
                              "naming the argument", ("rejects_bad_input",)),
        ),
    )
)


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
    if w.numel() == 0:
        raise ValueError(f"quantize: w must have at least one element, got shape {tuple(w.shape)}")
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


def check_format(caps: QuantizationCaps, bits: int, granularity: str, group_size: int | None, who: str) -> None:
    """ValueError naming the argument when a valid call asks for a format the implementation does not declare."""
    if bits not in caps.bits:
        raise ValueError(f"{who}: bits={bits} is not served; it serves bits {caps.bits}")
    if granularity not in caps.granularities:
        raise ValueError(f"{who}: granularity={granularity!r} is not served; it serves {caps.granularities}")
    if granularity == "group" and caps.group_sizes is not None and group_size not in caps.group_sizes:
        raise ValueError(f"{who}: group_size={group_size} is not served; it serves group sizes {caps.group_sizes}")
    if granularity == "group" and group_size in caps.excluded_group_sizes:
        raise ValueError(f"{who}: group_size={group_size} is not served; it excludes {caps.excluded_group_sizes}")


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


def code_range(bits: int, symmetric: bool, convention: str = "restricted") -> tuple[int, int]:
    """The smallest and largest code of a b-bit format."""
    if not symmetric:
        return 0, 2**bits - 1
    return (-qmax(bits), qmax(bits)) if convention == "restricted" else (-(2 ** (bits - 1)), qmax(bits))


def scale_divisor(bits: int, convention: str) -> float:
    """The absmax scale rule's divisor: s = max|w| / divisor (signed_extreme: s = extreme / -divisor)."""
    return {"restricted": qmax(bits), "full": qmax(bits) + 0.5, "signed_extreme": 2.0 ** (bits - 1)}[convention]


def scale_rounding(scale: torch.Tensor, scale_dtype: str | None) -> torch.Tensor:
    """r: how far a scale stored in ``scale_dtype`` may be from the unrounded one the codes were computed with
    (half its spacing there, subnormals included); 0 where scale_dtype is None (the scale is w's own)."""
    if scale_dtype is None:
        return torch.zeros_like(scale, dtype=torch.float64)
    info = torch.finfo(getattr(torch, scale_dtype))
    return scale.double().abs() * info.eps / 2 + info.tiny * info.eps / 2


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
        floating = qt.zero.is_floating_point() or qt.zero.is_complex()
        if floating != (impl.caps.zero_point != "integer"):  # a fractional zero point cannot map 0 exactly
            raise ContractViolation(f"{impl.name} zero: dtype {qt.zero.dtype}, expected "
                                    f"{'an integer' if impl.caps.zero_point == 'integer' else 'a floating'} dtype "
                                    f"(declared zero_point={impl.caps.zero_point!r})")
    if bool((qt.scale < 0).any()) and impl.caps.code_range != "signed_extreme" and impl.caps.zero_point != "float_edge":
        raise ContractViolation(f"{impl.name} scale: negative scale {qt.scale.min().item():.3g}")
    if impl.caps.scale_dtype is not None:
        stored = qt.scale.to(getattr(torch, impl.caps.scale_dtype)).to(qt.scale.dtype)
        if not torch.equal(stored, qt.scale):
            bad = (stored != qt.scale).nonzero()[0].tolist()
            raise ContractViolation(f"{impl.name} scale: {qt.scale[tuple(bad)].item()!r} at {bad} is not a "
                                    f"{impl.caps.scale_dtype} value, as its declared scale_dtype says")
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
