"""The quantized linear layer contract.

    quantized_linear(x, w, *, bits: int = 8, calib: Tensor | None = None) -> Tensor

* x: (..., in) activations, w: (out, in) weight (no bias: add it outside, in floating point).
  bits in 2..8 for the weight and, where quantized, the activations.  calib: (n, in) calibration
  activations for schemes with statistics (SmoothQuant); None means x itself.
* x, w and calib share one floating dtype and one device (a float32 x with a float64 w is refused, naming
  w: promoting would silently return float64).  w must be non-empty; x may hold no tokens (the output is
  then empty).
* Returns approximately x @ w.T, shape (..., out), x's dtype and device.  Inputs are left unchanged.
* The scheme is declared in ``caps`` and fixes the result up to float rounding:
    weight: "tensor" | "channel" | "group" (+ group_size): symmetric absmax scales of w
    code_range: "restricted" (codes +-(2^(b-1) - 1), the default) or "full" (-2^(b-1)..2^(b-1) - 1 with
      s = absmax / (2^(b-1) - 1/2), torchao's int8), for the weight and the activations alike
    act: None (weight only) | "tensor" | "token": absmax scales of x computed at run time
    outlier_threshold: LLM.int8(): the input columns with some |x| > threshold stay in floating point
      (``outlier_compare=">="``: |x| >= threshold, as bitsandbytes compares)
    compute_dtype: the dtype the layer computes in when it is narrower than x's (bitsandbytes casts x and w to
      float16 before quantizing them): the scheme is then that of x, w and calib rounded to it, and the rounding
      allowance that dtype's, while the output keeps x's dtype
    smooth_alpha: SmoothQuant: x / s and s * w with s_j = max|X_j|^a / max|W_j|^(1-a), before quantizing
  The float64 oracle of a scheme is `llm_inference_harness.references.quantized_linear64`; the error of the scheme
  against x @ w.T is bounded element-wise by `llm_inference_harness.references.quantized_linear_error_bound`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from llm_inference_harness.contracts import Rule, Technique, batch_rules, define
from llm_inference_harness.contracts.quantization import GRANULARITIES
from llm_inference_harness.engine.capabilities import BatchedCaps, cap
from llm_inference_harness.engine.guard import call_limit, check_tensor, guarded_call

if TYPE_CHECKING:  # the registry imports the contracts: they name its record for type checking only
    from llm_inference_harness.engine.registry import Impl


@dataclass(frozen=True)
class QuantizedLinearCaps(BatchedCaps):
    weight: Literal["tensor", "channel", "group"] = cap("channel", "granularity of the weight's absmax scales")
    group_size: int | None = cap(None, "columns per weight scale when weight='group'")
    act: Literal["tensor", "token"] | None = cap(None, "absmax scales of the activations, computed at run time; "
                                                       "None: weight-only")
    outlier_threshold: float | None = cap(None, "LLM.int8(): input columns with some |x| > threshold stay in "
                                                "floating point")
    smooth_alpha: float | None = cap(None, "SmoothQuant's migration strength a: s_j = max|X_j|^a / max|W_j|^(1-a)")
    bits: tuple[int, ...] = cap((2, 3, 4, 5, 6, 7, 8), "the bit widths it serves (a library's int8 kernel: (8,))")
    code_range: Literal["restricted", "full"] = cap("restricted", "codes +-(2^(b-1)-1) with s = absmax/(2^(b-1)-1), "
                                                                  "or full -2^(b-1)..2^(b-1)-1 with s = absmax/"
                                                                  "(2^(b-1)-1/2) (torchao: absmax/127.5)")
    outlier_compare: Literal[">", ">="] = cap(">", "LLM.int8(): a column is an outlier where some |x| > threshold, "
                                                  "or >= (bitsandbytes)")
    compute_dtype: Literal["float32", "bfloat16", "float16"] | None = cap(
        None, "the dtype it computes in where x's is wider (bitsandbytes: float16); None: x's own")

QUANTIZED_LINEAR = define(
    Technique(
        name="quantized_linear",
        signature="quantized_linear(x, w, *, bits: int = 8, calib: Tensor | None = None) -> Tensor",
        summary="x @ w.T with quantized weights (and activations): weight-only, W8A8, LLM.int8(), SmoothQuant",
        properties=("llm_inference_harness.properties.test_quantized_linear",
                    "llm_inference_harness.properties.test_quantized_linear_batch"),
        reference="",
        caps=QuantizedLinearCaps,
        rules=(
            Rule("scheme", "the output is the declared scheme's dequantized computation, up to float rounding, for "
                           "any leading dims and in the declared compute dtype",
                 ("matches_scheme_reference", "matches_scheme_in_low_precision", "any_leading_dims",
                  "computes_in_the_declared_dtype", "outliers_follow_each_batch")),
            Rule("error bound", "|y - x @ w.T| stays within the bound derived from the scheme's own steps",
                 ("error_within_derived_bound",)),
            Rule("outliers", "LLM.int8(): input columns past the declared threshold, compared as declared, stay in "
                             "floating point",
                 ("outlier_columns_exact", "outlier_threshold_comparison", "outliers_follow_each_batch")),
            Rule("zeros", "all-zero tokens give exactly zero outputs, all-zero weight rows (pruned output channels) "
                          "exactly zero output columns, and x with no tokens an empty (..., out) output",
                 ("all_zero_tokens_give_zeros", "no_tokens_give_an_empty_output")),
            Rule("bad input", "bits, weights, activations, shapes and dtypes that break the contract raise "
                              "ValueError/TypeError naming the argument", ("rejects_bad_input",)),
            *batch_rules(),
        ),
    )
)


@dataclass(frozen=True)
class Scheme:
    weight: str = "channel"
    group_size: int | None = None
    act: str | None = None
    outlier_threshold: float | None = None
    smooth_alpha: float | None = None
    code_range: str = "restricted"
    outlier_compare: str = ">"
    compute_dtype: str | None = None

    def __post_init__(self) -> None:
        """A scheme comes from an implementation's declared capabilities (a plugin's too): reject what no
        reference computes, naming the capability, rather than compare against the wrong one."""
        if self.weight not in GRANULARITIES:
            raise ValueError(f"quantized_linear: capability weight must be one of {GRANULARITIES}, got {self.weight!r}")
        if self.act not in (None, "tensor", "token"):
            raise ValueError(f"quantized_linear: capability act must be None, 'tensor' or 'token', got {self.act!r}")
        if self.weight == "group" and not (isinstance(self.group_size, int) and self.group_size > 0):
            raise ValueError(f"quantized_linear: weight='group' needs a positive integer group_size, got "
                             f"{self.group_size!r}")

    @classmethod
    def of(cls, impl: Impl) -> Scheme:
        c = impl.caps
        return cls(weight=c.weight, group_size=c.group_size, act=c.act, outlier_threshold=c.outlier_threshold,
                   smooth_alpha=c.smooth_alpha, code_range=c.code_range, outlier_compare=c.outlier_compare,
                   compute_dtype=c.compute_dtype)

    def working_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype the scheme computes in for inputs of ``dtype``: the declared compute dtype where narrower."""
        if self.compute_dtype is None:
            return dtype
        compute = getattr(torch, self.compute_dtype)
        return compute if torch.finfo(compute).bits < torch.finfo(dtype).bits else dtype


def check_bits(served: tuple[int, ...], bits: int, who: str) -> None:
    """ValueError naming bits when a valid width is one the implementation does not declare it serves."""
    if bits not in served:
        raise ValueError(f"{who}: bits={bits} is not served; it serves bits {served}")


def check_inputs(x: torch.Tensor, w: torch.Tensor, bits: int, calib: torch.Tensor | None = None) -> None:
    """Validate a call; ValueError/TypeError names the argument (devices and dtypes first: a tensor on another
    device cannot even be tested for NaN here)."""
    for name, t in (("x", x), ("w", w), ("calib", calib)):
        if name == "calib" and t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"quantized_linear: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise ValueError(f"quantized_linear: {name} must be floating point, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"quantized_linear: {name} is on {t.device} but x is on {x.device}; all inputs must be "
                             "on one device")
        if t.dtype != x.dtype:
            raise TypeError(f"quantized_linear: {name} is {t.dtype} but x is {x.dtype}; x, w and calib must share a "
                            "dtype (promotion would silently change the output's)")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"quantized_linear: {name} holds NaN or inf values" + (
                " (SmoothQuant would silently stop smoothing)" if name == "calib" else ""))
    if w.dim() != 2 or w.numel() == 0:
        raise ValueError(f"quantized_linear: w must be a non-empty 2-d (out, in) tensor, got shape {tuple(w.shape)}")
    if x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"quantized_linear: x's last dim must be w's in-features {w.shape[1]}, got {tuple(x.shape)}")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"quantized_linear: bits must be an integer in 2..8, got {bits!r}")
    if calib is not None and (calib.dim() != 2 or calib.shape[1] != w.shape[1]):
        raise ValueError(f"quantized_linear: calib must be (n, {w.shape[1]}), got {tuple(calib.shape)}")


def no_tokens_output(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """The whole answer for an x with no tokens, an empty (..., out); None when there is work to do."""
    return x.new_zeros(*x.shape[:-1], w.shape[0]) if x.numel() == 0 else None


def call(impl: Impl, x: torch.Tensor, w: torch.Tensor, *, bits: int, calib: torch.Tensor | None = None):
    out = guarded_call(impl.fn, x, w, bits=bits, calib=calib, arg_names=("x", "w"), timeout_s=call_limit(impl))
    return check_tensor(out, what=f"{impl.name} output", shape=(*x.shape[:-1], w.shape[0]), dtype=x.dtype,
                        device=x.device)
