"""Paged attention by gathering each sequence's keys and values out of the block pool: a plugin for the
paged_attention contract (harness/contracts/paged_attention.py).

    harness check paged_attention --plugin docs/examples/paged_attention.py:paged_attention
"""

import torch

from llm_inference_harness import declare
from llm_inference_harness.contracts.attention import check_scores_budget
from llm_inference_harness.contracts.paged_attention import check_inputs


@declare(dtypes=("float32", "float64"), devices=("cpu",))
def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None):
    scale = check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale, causal)
    check_scores_budget("my paged attention", q[:1], max(seq_lens.tolist(), default=0), copies=2)  # one sequence's S, P
    B, H, Nq, d = q.shape
    Hkv, block_size = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros_like(q)  # (B, H, Nq, d)
    for b in range(B):
        n = int(seq_lens[b])
        blocks = block_tables[b, : -(-n // block_size)].long()  # the sequence's blocks, in logical order
        k = k_cache[blocks].transpose(0, 1).reshape(Hkv, -1, d)[:, :n]  # (Hkv, n, d): slots past n never read
        v = v_cache[blocks].transpose(0, 1).reshape(Hkv, -1, d)[:, :n]  # (Hkv, n, d)
        k, v = k.repeat_interleave(H // Hkv, dim=0), v.repeat_interleave(H // Hkv, dim=0)  # (H, n, d)
        s = q[b] @ k.transpose(-1, -2) * scale  # (H, Nq, n)
        i, j = torch.arange(Nq)[:, None], torch.arange(n)[None, :]
        visible = j <= i + n - Nq if causal else torch.ones(Nq, n, dtype=torch.bool)
        p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)
        out[b] = torch.where(visible.any(dim=-1, keepdim=True), p, 0) @ v  # a row that sees no key -> 0
    return out
