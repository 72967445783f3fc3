"""Known-wrong batch-invariant linear layer: a split-K GEMM whose number of K splits follows the token count.

GEMM libraries split the reduction dimension when M is small, to keep the machine busy (cuBLAS's and
CUTLASS's split-K heuristics; a decode step has M = batch size): the partial sums of the splits are added
at the end, which is exact in real arithmetic and a different rounding in floating point.  Here the
in-features are split into max(1, 8 // tokens) parts, so a token alone takes 8 and the same token in a batch
of 8 or more one; otherwise the weight-only layer of impls/quantized_linear/batch_invariant.py.
He et al. 2025, "Defeating Nondeterminism in LLM Inference", section "batch-invariant matmul".
"""

import math

import torch

from harness.contracts.quantization import dequantize
from harness.contracts.quantized_linear import check_inputs
from harness.fixed_order import matmul
from harness.registry import register
from impls.quantization.absmax import quantize_absmax

SPLIT_TOKENS = 8  # tokens below which the reduction is split


@register("quantized_linear", "mutant_splitk_by_token_count", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
          exact=False, mutant=True, killed_by=("rows_are_batch_invariant",),
          bug="splits the in-features into max(1, 8 // tokens) parts summed at the end (split-K for small M): a "
              "token's bits depend on how many tokens share its batch",
          caps={"weight": "channel", "batch_invariant": True, "deterministic": True})
def splitk_by_token_count(x, w, *, bits=8, calib=None):
    check_inputs(x, w, bits, calib)
    x2 = x.reshape(-1, x.shape[-1])  # (n, in)
    w_hat = dequantize(quantize_absmax(w, bits, "channel")).to(x.dtype)  # (out, in)
    size = math.ceil(x2.shape[1] / max(1, SPLIT_TOKENS // max(1, x2.shape[0])))
    parts = [matmul(x2[:, k0:k0 + size], w_hat[:, k0:k0 + size].T) for k0 in range(0, x2.shape[1], size)]
    return torch.stack(parts).sum(0).reshape(*x.shape[:-1], w.shape[0])  # (..., out)
