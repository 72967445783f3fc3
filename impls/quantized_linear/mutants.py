"""Known-wrong quantized linear layers, each modelled on a real bug: the float64-emulated W8A8 and
LLM.int8() with one bug each.
"""

import torch

from llm_inference_harness.contracts.quantization import qmax
from llm_inference_harness.contracts.quantized_linear import check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.quantized_linear.llm_int8 import THRESHOLD, llm_int8_linear, outlier_columns
from llm_inference_harness.impls.quantized_linear.w8a8_emulated import codes_f64, w8a8_emulated

DTYPES = ("float64", "float32")
W8A8 = {"weight": "channel", "act": "token"}


@register("quantized_linear", "mutant_zero_scale_nan", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
          mutant=True, bug="per-token scale of an all-zero (padding) token is 0 and x / 0 = NaN reaches the output",
          killed_by=("all_zero_tokens_give_zeros",), caps={"weight": "channel", "act": "token"})
def mutant_zero_scale_nan(x, w, *, bits=8, calib=None):
    return w8a8_emulated(x, w, bits=bits, calib=calib, guard_zero=False)


_previous: dict[int, torch.Tensor] = {}  # in-features -> outlier columns of the last batch seen


@register("quantized_linear", "mutant_stale_outliers", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
          mutant=True, bug="outlier columns detected on a previous batch are reused for the next one",
          killed_by=("outliers_follow_each_batch",),
          caps={"weight": "channel", "act": "token", "outlier_threshold": THRESHOLD})
def mutant_stale_outliers(x, w, *, bits=8, calib=None):
    fresh = outlier_columns(x.reshape(-1, x.shape[-1]), THRESHOLD)  # (in,)
    cols = _previous.setdefault(x.shape[-1], fresh).to(x.device)
    return llm_int8_linear(x, w, bits=bits, calib=calib, outliers=cols)


@register("quantized_linear", "mutant_outliers_from_calib", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
          mutant=True, bug="LLM.int8() takes its outlier columns from the calibration batch instead of the input: "
          "a column that is an outlier only at run time goes through int8", killed_by=("matches_scheme_reference",),
          caps={"weight": "channel", "act": "token", "outlier_threshold": THRESHOLD})
def mutant_outliers_from_calib(x, w, *, bits=8, calib=None):
    seen = x.reshape(-1, x.shape[-1]) if calib is None else calib
    return llm_int8_linear(x, w, bits=bits, calib=calib, outliers=outlier_columns(seen, THRESHOLD))


@register("quantized_linear", "mutant_outliers_at_threshold", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
          mutant=True, bug="LLM.int8() compares |x| >= threshold (as bitsandbytes does) while declaring >: a column "
          "whose peak is exactly the threshold leaves the int8 product", killed_by=("outlier_threshold_comparison",),
          caps={"weight": "channel", "act": "token", "outlier_threshold": THRESHOLD})
def mutant_outliers_at_threshold(x, w, *, bits=8, calib=None):
    at_or_above = (x.reshape(-1, x.shape[-1]).abs() >= THRESHOLD).any(dim=0)  # (in,)
    return llm_int8_linear(x, w, bits=bits, calib=calib, outliers=at_or_above)


# --- shapes, dtypes, devices and empty batches: bugs the cases could not reach before square weights, long rows,
# 1-d / 4-d x and the dtype and device rules ------------------------------------------------------------------
@register("quantized_linear", "mutant_square_weight_as_in_out", devices=("cpu", "cuda"), dtypes=DTYPES, mutant=True,
          bug="a kernel that sniffs the layout from the shape: a square weight is taken as (in, out) and transposed",
          killed_by=("matches_scheme_reference", "matches_scheme_in_low_precision"), caps=W8A8)
def mutant_square_weight_as_in_out(x, w, *, bits=8, calib=None):
    square = isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[0] == w.shape[1]
    return w8a8_emulated(x, w.t() if square else w, bits=bits, calib=calib)


@register("quantized_linear", "mutant_token_scale_first_256", devices=("cpu", "cuda"), dtypes=DTYPES, mutant=True,
          bug="per-token scales from the first 256 features only (one block of a row-wise kernel): longer rows clamp",
          killed_by=("matches_scheme_reference",), caps=W8A8)
def mutant_token_scale_first_256(x, w, *, bits=8, calib=None):
    check_inputs(x, w, bits, calib)
    x2 = x.reshape(-1, x.shape[-1]).double()  # (n, in)
    sx = x2[:, :256].abs().amax(dim=-1, keepdim=True) / qmax(bits)  # (n, 1): the block's absmax only
    qx = torch.round(x2 / torch.where(sx > 0, sx, torch.ones_like(sx))).clamp(-qmax(bits), qmax(bits))
    qw, sw = codes_f64(w, bits)  # (out, in), (out, 1)
    return ((qx @ qw.T) * sx * sw.T).to(x.dtype).reshape(*x.shape[:-1], w.shape[0])  # (..., out)


@register("quantized_linear", "mutant_flattens_only_3d", devices=("cpu", "cuda"), dtypes=DTYPES, mutant=True,
          bug="only a 3-d x is flattened to (tokens, in): a 4-d x keeps its shape, and its row scales come from a "
          "reduction over dim 1 (bitsandbytes' torch.max(A.abs(), dim=1)), shared by the tokens along it",
          killed_by=("any_leading_dims",), caps=W8A8)
def mutant_flattens_only_3d(x, w, *, bits=8, calib=None):
    if not (isinstance(x, torch.Tensor) and x.dim() == 4):
        return w8a8_emulated(x, w, bits=bits, calib=calib)
    check_inputs(x, w, bits, calib)
    sx = x.double().abs().amax(dim=1, keepdim=True).amax(dim=-1, keepdim=True) / qmax(bits)  # (a, 1, n, 1)
    qx = torch.round(x.double() / torch.where(sx > 0, sx, torch.ones_like(sx))).clamp(-qmax(bits), qmax(bits))
    qw, sw = codes_f64(w, bits)
    return ((qx @ qw.T) * sx * sw.T).to(x.dtype)  # (a, b, n, out)


@register("quantized_linear", "mutant_promotes_mixed_dtypes", devices=("cpu", "cuda"), dtypes=DTYPES, mutant=True,
          bug="no dtype rule: a float32 x with a float64 w is promoted and the output is silently float64",
          killed_by=("rejects_bad_input",), caps=W8A8)
def mutant_promotes_mixed_dtypes(x, w, *, bits=8, calib=None):
    if isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dtype != w.dtype and x.is_floating_point():
        x = x.to(torch.promote_types(x.dtype, w.dtype))  # what x @ w.T would do
        w = w.to(x.dtype)
    return w8a8_emulated(x, w, bits=bits, calib=calib)


@register("quantized_linear", "mutant_devices_unchecked", devices=("cpu", "cuda"), dtypes=DTYPES, mutant=True,
          bug="no device check: a w on another device than x fails deep inside the matmul with a RuntimeError",
          killed_by=("rejects_bad_input",), caps=W8A8)
def mutant_devices_unchecked(x, w, *, bits=8, calib=None):
    if isinstance(w, torch.Tensor) and isinstance(x, torch.Tensor) and w.device != x.device:
        return x.double() @ w.double().T  # the matmul a layer reaches without the contract's check
    return w8a8_emulated(x, w, bits=bits, calib=calib)


@register("quantized_linear", "mutant_empty_batch_crashes", devices=("cpu", "cuda"), dtypes=DTYPES, mutant=True,
          bug="the per-tensor activation scale of an empty batch: amax of no tokens raises a RuntimeError",
          killed_by=("no_tokens_give_an_empty_output",), caps={"weight": "channel", "act": "tensor"})
def mutant_empty_batch_crashes(x, w, *, bits=8, calib=None):
    check_inputs(x, w, bits, calib)
    x2 = x.reshape(-1, x.shape[-1]).double()  # (n, in)
    sx = x2.abs().amax() / qmax(bits)  # () -- raises when n = 0
    qx = torch.round(x2 / torch.where(sx > 0, sx, torch.ones_like(sx))).clamp(-qmax(bits), qmax(bits))
    qw, sw = codes_f64(w, bits)
    return ((qx @ qw.T) * sx * sw.T).to(x.dtype).reshape(*x.shape[:-1], w.shape[0])  # (..., out)
