"""Known-wrong batch-invariant linear layers: split-K GEMMs whose partial sums meet in an order that is not fixed.

* splitk_by_token_count: the number of K splits follows the token count.  GEMM libraries split the
  reduction dimension when M is small, to keep the machine busy (cuBLAS's and CUTLASS's split-K heuristics;
  a decode step has M = batch size): the partial sums of the splits are added at the end, which is exact in
  real arithmetic and a different rounding in floating point.  Here the in-features are split into
  max(1, 8 // tokens) parts, so a token alone takes 8 and the same token in a batch of 8 or more one;
  otherwise the weight-only layer of impls/quantized_linear/batch_invariant.py.
* splitk_atomic_accumulation: a fixed 4-way split of K whose partials are added into the output with atomics
  (Triton's matmul with SPLIT_K > 1 and tl.atomic_add, cuBLAS's atomics mode): the order they arrive in
  follows the scheduling, so the bits change from run to run.  Here the order alternates between ascending
  and descending call by call: a rerun always sees the other order, so the fault shows, and replays, every time.
He et al. 2025, "Defeating Nondeterminism in LLM Inference", sections "batch-invariant matmul" and "atomic adds".
"""

import itertools
import math

import torch

from llm_inference_harness.contracts.quantization import dequantize
from llm_inference_harness.contracts.quantized_linear import check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.quantization.absmax import quantize_absmax
from llm_inference_harness.numerics.fixed_order import matmul

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


SPLITS = 4  # K splits of the atomic split-K GEMM
_calls = itertools.count()  # stands in for the scheduling that decides which split's atomic add lands first


@register("quantized_linear", "mutant_splitk_atomic_accumulation", devices=("cpu", "cuda"),
          dtypes=("float64", "float32"), exact=False, mutant=True, killed_by=("same_bits_every_run_and_thread_count",),
          bug="splits the in-features into 4 parts whose partial sums are added into the output in an order that "
              "changes from call to call (atomic adds land in scheduling order): the bits change run to run",
          caps={"weight": "channel", "batch_invariant": True, "deterministic": True})
def splitk_atomic_accumulation(x, w, *, bits=8, calib=None):
    check_inputs(x, w, bits, calib)
    x2 = x.reshape(-1, x.shape[-1])  # (n, in)
    w_hat = dequantize(quantize_absmax(w, bits, "channel")).to(x.dtype)  # (out, in)
    size = math.ceil(x2.shape[1] / SPLITS)
    parts = [matmul(x2[:, k0:k0 + size], w_hat[:, k0:k0 + size].T) for k0 in range(0, x2.shape[1], size)]  # (n, out)
    out = torch.zeros_like(parts[0])  # (n, out): the zeroed output the atomic adds accumulate into
    for part in parts if next(_calls) % 2 == 0 else parts[::-1]:
        out += part
    return out.reshape(*x.shape[:-1], w.shape[0])  # (..., out)
