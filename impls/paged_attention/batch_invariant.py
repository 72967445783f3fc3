"""Batch-invariant paged attention: each sequence's keys gathered in logical order, then attention with every
reduction in a fixed order (harness/numerics/fixed_order.py).

Keys past seq_lens[b] and above the causal diagonal are masked; they come after the keys a query sees, and
add exact zeros to its trees, so the result of sequence b depends on its own q, blocks and length only --
not on the longest sequence of the batch (the gathered width), the others, their order, how many of its
queries share the call (a chunked prefill), or the thread count.  Invariant: out[b] is bit-identical to
the same call on sequence b alone.  Kwon et al. 2023, "vLLM", Sec. 4.1; He et al. 2025, "Defeating
Nondeterminism in LLM Inference" (fixed reduction order).
"""

import torch

from llm_inference_harness.contracts.attention import check_scores_budget
from llm_inference_harness.contracts.paged_attention import check_inputs, key_mask
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.paged_attention.gather import gather_kv
from llm_inference_harness.numerics.fixed_order import attention
from llm_inference_harness.numerics.online_softmax import accumulator_dtype


@register("paged_attention", "batch_invariant", devices=("cpu", "cuda"),
          caps={"batch_invariant": True, "deterministic": True},
          cite="Kwon et al. 2023, Sec. 4.1; He et al. 2025 (fixed reduction order)")
def batch_invariant_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None):
    scale = check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale, causal)
    if q.numel() == 0:  # B, H or Nq is 0: seq_lens.max() below has nothing to reduce
        return torch.zeros_like(q)
    acc_t = accumulator_dtype(q.dtype)
    used = -(-int(seq_lens.max()) // k_cache.shape[2])  # table entries past every sequence's end: never gathered
    check_scores_budget("paged_attention batch_invariant", q, used * k_cache.shape[2], copies=3, dtype=acc_t)
    k, v = (gather_kv(c, block_tables[:, :used]).to(acc_t) for c in (k_cache, v_cache))  # (B, Hkv, Nk, d)
    visible = key_mask(seq_lens, q.shape[2], k.shape[2], causal)  # (B, 1, 1, Nq|1, Nk): a prefix of each row
    return attention(q.to(acc_t), k, v, visible, scale).to(q.dtype)  # (B, H, Nq, d)
