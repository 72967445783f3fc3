"""Gather-then-attend: copy each sequence's K/V out of the block pool into a contiguous tensor, then attend.

k_cache[block_tables] lays every sequence's blocks side by side in logical order; keys past
seq_lens[b] (the unused tail of the last block, padding table entries) are masked out of the scores
*and* zeroed in V, since 0 * NaN = NaN would otherwise leak garbage slots into the output.
Invariant: only slots j < seq_lens[b] contribute.  Half-precision inputs carry scores and softmax in
float32 (the attention contract's score_dtype: a bfloat16 logit past 256 is off by a nat), P rounded
back before P V.  Kwon et al. 2023, "vLLM", Sec. 4.1 (the reference the paged kernel is tested against
in vLLM's test_attention.py).
"""

import torch

from llm_inference_harness.contracts.attention import check_scores_budget, score_dtype
from llm_inference_harness.contracts.paged_attention import check_inputs, key_mask
from llm_inference_harness.engine.registry import register


def gather_kv(cache, block_tables):
    B, max_blocks = block_tables.shape
    _, Hkv, bs, d = cache.shape
    g = cache[block_tables]  # (B, max_blocks, Hkv, bs, d)
    return g.permute(0, 2, 1, 3, 4).reshape(B, Hkv, max_blocks * bs, d)  # (B, Hkv, Nk, d)


@register("paged_attention", "gather_then_attend", devices=("cpu", "cuda"), cite="Kwon et al. 2023, Sec. 4.1")
def gather_then_attend(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None):
    scale = check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale, causal)
    if q.numel() == 0:  # B, H or Nq is 0: seq_lens.max() below has nothing to reduce
        return torch.zeros_like(q)
    (B, H, Nq, d), Hkv = q.shape, k_cache.shape[1]
    used = -(-int(seq_lens.max()) // k_cache.shape[2])  # table entries past every sequence's end: never gathered
    check_scores_budget("paged_attention gather", q, used * k_cache.shape[2], copies=2)
    k, v = gather_kv(k_cache, block_tables[:, :used]), gather_kv(v_cache, block_tables[:, :used])  # (B, Hkv, Nk, d)
    Nk = k.shape[2]
    ok = key_mask(seq_lens, Nq, Nk, causal)  # (B, 1, 1, Nq|1, Nk)
    v.masked_fill_(~ok.any(dim=3).reshape(B, 1, Nk, 1), 0)  # our own copy: garbage slots -> 0 (0 * NaN = NaN)
    wide = score_dtype(q.dtype)
    qg = (q.to(wide) * scale).reshape(B, Hkv, H // Hkv * Nq, d)  # (B, Hkv, G*Nq, d): head h reads kv head h // G
    s = (qg @ k.to(wide).transpose(-1, -2)).reshape(B, Hkv, H // Hkv, Nq, Nk).masked_fill(~ok, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)  # (B, Hkv, G, Nq, 1)
    p = torch.exp(s - torch.where(torch.isfinite(m), m, 0))
    l = p.sum(dim=-1, keepdim=True)  # noqa: E741
    p = (p / torch.where(l > 0, l, 1)).to(q.dtype).reshape(B, Hkv, H // Hkv * Nq, Nk)  # (B, Hkv, G*Nq, Nk)
    return (p @ v).reshape(B, H, Nq, d)  # (B, H, Nq, d)
