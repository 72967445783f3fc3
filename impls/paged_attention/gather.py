"""Gather-then-attend: copy each sequence's K/V out of the block pool into a contiguous tensor, then attend.

k_cache[block_tables] lays every sequence's blocks side by side in logical order; keys past
seq_lens[b] (the unused tail of the last block, padding table entries) are masked out of the scores
*and* zeroed in V, since 0 * NaN = NaN would otherwise leak garbage slots into the output.
Invariant: only slots j < seq_lens[b] contribute.  Kwon et al. 2023, "vLLM", Sec. 4.1 (the
reference the paged kernel is tested against in vLLM's test_attention.py).
"""

import torch

from harness.contracts.paged_attention import check_inputs, key_mask
from harness.registry import register


def gather_kv(cache, block_tables):
    B, max_blocks = block_tables.shape
    _, Hkv, bs, d = cache.shape
    g = cache[block_tables]  # (B, max_blocks, Hkv, bs, d)
    return g.permute(0, 2, 1, 3, 4).reshape(B, Hkv, max_blocks * bs, d)  # (B, Hkv, Nk, d)


@register("paged_attention", "gather_then_attend", devices=("cpu", "cuda"), cite="Kwon et al. 2023, Sec. 4.1")
def gather_then_attend(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None):
    scale = check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale)
    (B, H, Nq, d), Hkv = q.shape, k_cache.shape[1]
    k, v = gather_kv(k_cache, block_tables), gather_kv(v_cache, block_tables)  # (B, Hkv, Nk, d)
    ok = key_mask(seq_lens, Nq, k.shape[2], causal)  # (B, 1, 1, Nq|1, Nk)
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d)
    s = (qg @ k[:, :, None].transpose(-1, -2) * scale).masked_fill(~ok, float("-inf"))  # (B, Hkv, G, Nq, Nk)
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isfinite(m), m, 0))
    l = p.sum(dim=-1, keepdim=True)  # noqa: E741
    v = torch.where(ok.any(dim=3)[..., None], v[:, :, None], 0)  # (B, Hkv, 1, Nk, d): garbage slots -> 0
    return ((p / torch.where(l > 0, l, 1)) @ v).reshape(B, H, Nq, d)  # (B, H, Nq, d)
