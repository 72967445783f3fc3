"""Batch-invariant attention: softmax(q k^T * scale) v with every reduction in a fixed order.

Scores are dot products over d and the output sums over the keys, each added term by term in index order,
the normalizer a tree over the keys (harness/numerics/fixed_order.py), so a row's output depends on its own q,
k and v only: not on the batch size, the other rows, their order, how many of its queries share the call
(keys a query cannot see add exact zeros), or the thread count.  Invariant: out[b] is bit-identical to
the same call on row b alone, and a chunk of causal queries with the keys its last query sees gives the
same bits as those rows of the whole call.  He et al. 2025, "Defeating Nondeterminism in LLM Inference",
section "batch-invariant attention" (fixed split size, no batch-dependent split-K).
"""

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs, check_scores_budget, no_work_output
from llm_inference_harness.engine.registry import register
from llm_inference_harness.numerics.fixed_order import attention
from llm_inference_harness.numerics.online_softmax import accumulator_dtype


@register("attention", "batch_invariant", devices=("cpu", "cuda"),
          caps={"batch_invariant": True, "deterministic": True},
          cite="He et al. 2025, Defeating Nondeterminism in LLM Inference (fixed reduction order)")
def batch_invariant_attention(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)
    (Nq, Nk), acc_t = (q.shape[2], k.shape[2]), accumulator_dtype(q.dtype)
    if (empty := no_work_output(q, Nk)) is not None:
        return empty
    check_scores_budget("attention batch_invariant", q, Nk, copies=3, dtype=acc_t)  # S, P and the term products
    everything = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    visible = causal_allowed(Nq, Nk, device=q.device) if causal else everything  # (Nq, Nk)
    out = attention(q.to(acc_t), k.to(acc_t), v.to(acc_t), visible[None, None, None], scale)  # (B, H, Nq, d)
    return out.to(q.dtype)
