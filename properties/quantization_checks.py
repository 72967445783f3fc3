"""The quantization properties' shared checks: which implementations a law applies to (symmetric or not, the
granularities and bit widths declared), and the rounding allowed in a scale or an element computed in a dtype (the
("quantize", dtype) row of harness/engine/tolerance.py)."""

import torch

from llm_inference_harness.contracts.quantization import scale_rounding
from llm_inference_harness.engine.tolerance import TOLERANCES


def symmetric(impl) -> str | None:
    return None if impl.caps.symmetric else f"{impl.name} is asymmetric (zero point): no absmax round trip"


def asymmetric(impl) -> str | None:
    return None if not impl.caps.symmetric else f"{impl.name} is symmetric (absmax_round_trips checks it)"


def serves(*granularities: str, bits: int | None = None):
    """Skip reason unless the implementation declares these granularities (and bit width)."""

    def reason(impl) -> str | None:
        missing = [g for g in granularities if g not in impl.caps.granularities]
        if missing:
            return f"needs granularity {', '.join(missing)}; {impl.name} declares {impl.caps.granularities}"
        if bits is not None and bits not in impl.caps.bits:
            return f"needs {bits}-bit codes; {impl.name} declares bits {impl.caps.bits}"
        return None

    return reason


def scale_rtol(dtype: torch.dtype) -> float:
    """Relative error allowed in a scale computed in dtype: a few roundings (the table's "quantize" floor)."""
    return TOLERANCES[("quantize", dtype)].floor


def scale_allowance(impl, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """How far a returned scale may be from ``scale`` (float64): a few roundings in w's dtype plus the
    rounding to the declared scale_dtype."""
    return scale_rtol(dtype) * scale.double().abs() + scale_rounding(scale, impl.caps.scale_dtype)


def slack(w: torch.Tensor, w_hat: torch.Tensor) -> torch.Tensor:
    """Rounding of the arithmetic in w's dtype, element-wise (the tolerance table's floor)."""
    return TOLERANCES[("quantize", w.dtype)].floor * (w.double().abs() + w_hat.double().abs())
