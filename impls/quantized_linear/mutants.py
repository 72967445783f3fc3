"""Known-wrong quantized linear layers, each modelled on a real bug: the float64-emulated W8A8 and
LLM.int8() with one bug each.
"""

import torch

from harness.registry import register
from impls.quantized_linear.llm_int8 import THRESHOLD, llm_int8_linear, outlier_columns
from impls.quantized_linear.w8a8_emulated import w8a8_emulated


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
