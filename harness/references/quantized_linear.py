"""Float64 oracles of quantized linear layers, their plain computations and error bounds."""

from __future__ import annotations

import torch

from llm_inference_harness.contracts.quantization import QuantizationCaps, dequantize, step_per_element
from llm_inference_harness.contracts.quantized_linear import Scheme
from llm_inference_harness.references.quantization import declared_quantize64


def smoothing_factors64(act_absmax: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's s_j = max|X_j|^a / max|W_j|^(1-a), 1 where a channel of X or W is all zero."""
    a, m = act_absmax.double(), w.double().abs().amax(dim=0)  # (in,), (in,)
    ok = (a > 0) & (m > 0)
    return torch.where(ok, a.clamp(min=1e-300) ** alpha / m.clamp(min=1e-300) ** (1 - alpha), 1.0)


def _split(x, w, scheme: Scheme, calib):
    """(x, w) with LLM.int8()'s outlier columns (by the declared comparison) removed and SmoothQuant's factors
    applied, in float64 from their values in the scheme's working dtype, and the float64 product of the outlier
    columns."""
    work = scheme.working_dtype(x.dtype)  # a declared narrower compute dtype: the inputs rounded to it first
    x2, w = x.reshape(-1, x.shape[-1]).to(work).double(), w.to(work).double()  # (n, in)
    calib = None if calib is None else calib.to(work)
    y_outliers = torch.zeros(x2.shape[0], w.shape[0], dtype=torch.float64, device=x.device)  # (n, out)
    if scheme.outlier_threshold is not None:
        above = x2.abs() >= scheme.outlier_threshold if scheme.outlier_compare == ">=" else \
            x2.abs() > scheme.outlier_threshold
        cols = above.any(dim=0)  # (in,)
        y_outliers = x2[:, cols] @ w[:, cols].T
        x2, w = x2 * ~cols, w * ~cols
    if scheme.smooth_alpha is not None:
        stats = (x2 if calib is None else calib.double()).abs().amax(dim=0)  # (in,)
        s = smoothing_factors64(stats, w, scheme.smooth_alpha)
        x2, w = x2 / s, w * s
    return x2, w, y_outliers


def _quantized_operands(x2, w, bits: int, scheme: Scheme):
    fmt = QuantizationCaps(code_range=scheme.code_range)
    qw = declared_quantize64(w, bits, scheme.weight, scheme.group_size, fmt)
    act = "tensor" if scheme.act == "tensor" else "channel"
    qx = None if scheme.act is None else declared_quantize64(x2, bits, act, None, fmt)
    return qx, qw


def quantized_linear64(x, w, *, bits: int, scheme: Scheme, calib=None) -> torch.Tensor:
    """The scheme's dequantized computation in float64: y = x_O @ w_O.T + dq(q(x')) @ dq(q(w')).T."""
    x2, w2, y = _split(x, w, scheme, calib)
    qx, qw = _quantized_operands(x2, w2, bits, scheme)
    x_hat = x2 if qx is None else dequantize(qx)
    return (y + x_hat @ dequantize(qw).T).reshape(*x.shape[:-1], w.shape[0])  # (..., out)


def quantized_linear_plain(x, w, *, bits: int, scheme: Scheme, calib=None) -> list[torch.Tensor]:
    """Two float64 orders of the same computation (integer products first, then the scales; and the
    columns summed in reverse): their distance from quantized_linear64 is float64 rounding."""
    x2, w2, y = _split(x, w, scheme, calib)
    qx, qw = _quantized_operands(x2, w2, bits, scheme)
    w_hat = dequantize(qw)
    x_hat = x2 if qx is None else dequantize(qx)
    orders = [x_hat.flip(-1) @ w_hat.flip(-1).T]
    if scheme.weight != "group":  # one scale per output: integer (or unscaled) products first, then scales
        x_codes, x_scale = (x2, 1.0) if qx is None else (qx.codes.double(), qx.scale)
        orders.append((x_codes @ qw.codes.double().T) * x_scale * qw.scale.T)
    return [(y + o).reshape(*x.shape[:-1], w.shape[0]) for o in orders]


def quantized_linear_error_bound(x, w, *, bits: int, scheme: Scheme, calib=None) -> torch.Tensor:
    """|y - x @ w.T| <= sum_k |x_k| dw_k + dx_k |w_k| + dx_k dw_k (exact arithmetic), where dw, dx are the
    per-element steps / 2 of the scheme's scales; outlier columns contribute nothing (computed in float)."""
    x2, w2, _ = _split(x, w, scheme, calib)
    qx, qw = _quantized_operands(x2, w2, bits, scheme)
    dw = step_per_element(qw) / 2  # (out, in)
    dx = torch.zeros_like(x2) if qx is None else step_per_element(qx).expand_as(x2) / 2  # (n, in)
    bound = x2.abs() @ dw.T + dx @ w2.abs().T + dx @ dw.T  # (n, out)
    return bound.reshape(*x.shape[:-1], w.shape[0])


def quantized_linear_tie_bound(x, w, *, bits: int, scheme: Scheme, calib=None, rel: float) -> torch.Tensor:
    """How far codes rounded the other way can move y: computed in a lower precision, a value within ``rel``
    (relative) of a rounding tie, in units of its step, may get either code.  Each such weight moves y by one
    step times |x_hat|, each such activation by one step times |w_hat|; (..., out)."""
    x2, w2, _ = _split(x, w, scheme, calib)
    qx, qw = _quantized_operands(x2, w2, bits, scheme)

    def tied_steps(values, q):  # the step of every element within rel of a tie, else 0
        step = step_per_element(q).expand_as(values)
        r = values / step.clamp(min=1e-300)  # the value in steps
        return torch.where((r - r.floor() - 0.5).abs() <= rel * (r.abs() + 1), step, 0.0)

    dw = step_per_element(qw) / 2  # (out, in)
    dx = torch.zeros_like(x2) if qx is None else step_per_element(qx).expand_as(x2) / 2  # (n, in)
    bound = (x2.abs() + dx) @ tied_steps(w2, qw).T  # (n, out)
    if qx is not None:
        bound = bound + tied_steps(x2, qx) @ (w2.abs() + dw).T
    return bound.reshape(*x.shape[:-1], w.shape[0])
