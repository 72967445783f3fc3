"""LLM.int8(): mixed-precision decomposition of a W8A8 matmul.

The input columns O where some |x_ik| exceeds the threshold (6.0 in the paper) are multiplied in
floating point; the rest go through W8A8 with per-token scales of x and per-output-channel scales
of w, both computed without the outlier columns; the two results are summed.  The outlier set is
recomputed for every batch.  Invariant: the outlier part is exact (float), the rest obeys the W8A8
bound of its own (outlier-free, hence small) scales.
Dettmers et al. 2022, "LLM.int8()", section 3.2 (mixed-precision decomposition).
"""

import torch

from llm_inference_harness.contracts.quantized_linear import check_inputs, no_tokens_output
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.quantized_linear.w8a8 import w8a8_linear

THRESHOLD = 6.0


def outlier_columns(x2: torch.Tensor, threshold: float) -> torch.Tensor:
    """Bool (in,): the input features with some |x| above the threshold in this batch."""
    return (x2.abs() > threshold).any(dim=0)


def llm_int8_linear(x, w, *, bits=8, calib=None, threshold=THRESHOLD, outliers=None):
    check_inputs(x, w, bits, calib)
    if (empty := no_tokens_output(x, w)) is not None:
        return empty
    x2 = x.reshape(-1, x.shape[-1])  # (n, in)
    cols = outlier_columns(x2, threshold) if outliers is None else outliers  # (in,)
    keep = (~cols).to(x.dtype)  # (in,)
    y = x2[:, cols] @ w[:, cols].to(x.dtype).T + w8a8_linear(x2 * keep, w.to(x.dtype) * keep, bits=bits)  # (n, out)
    return y.reshape(*x.shape[:-1], w.shape[0])  # (..., out)


register("quantized_linear", "llm_int8", devices=("cpu", "cuda"), dtypes=("float64", "float32"), exact=False,
         cite="Dettmers et al. 2022, LLM.int8(), section 3.2",
         caps={"weight": "channel", "act": "token", "outlier_threshold": THRESHOLD})(
    lambda x, w, *, bits=8, calib=None: llm_int8_linear(x, w, bits=bits, calib=calib))
