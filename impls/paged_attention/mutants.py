"""Known-wrong paged attention kernels, each gather-then-attend with one real bug switched on.

The tests fill every unused slot with NaN and shuffle the physical blocks, which is what makes these
bugs visible (as vLLM's kernel tests do).
"""

import torch

from harness.contracts.paged_attention import check_inputs, key_mask
from harness.online_softmax import Partial, finalize, partial
from harness.registry import register
from impls.attention.mutants import as_if_contiguous
from impls.attention.mutants_splitk import merge_without_rescale
from impls.paged_attention.gather import gather_kv

PARTITION = 512  # vLLM V2's partition: only sequences longer than this see the combine

BUGS = {
    "reads_last_block_tail": "masks by whole blocks: the unused tail of the last block is attended to",
    "ignores_block_table": "assumes physical block i is logical block i (contiguous allocation)",
    "masks_scores_not_values": "masks the scores but multiplies 0 probabilities by the garbage values",
    "v2_combine_unrescaled": "vLLM V2's reduce weights each 512-token partition by its l_i without e^(m_i - m): "
                             "exact until a sequence spans two partitions",
    "v2_reduce_max_from_zero": "V2's reduce starts its global max at 0, not -inf: when every logit is far below 0, "
                               "each partition's l_i e^(m_i - 0) underflows to 0 and so does the row",
    "last_table_column_unread": "the block loop stops one column short of max_blocks, as if the last entry were "
                                "a sentinel: a sequence that fills its table loses its last block",
    "caches_read_contiguous": "k_cache and v_cache read through their data pointers with contiguous strides: the "
                              "two halves of one (num_blocks, 2, Hkv, bs, d) pool are read interleaved",
}
KILLERS = {"v2_combine_unrescaled": ("decode_matches_contiguous_attention",),  # needs > 512 keys: long decodes
           "v2_reduce_max_from_zero": ("logits_far_below_zero",)}


def buggy_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None, bug=""):
    scale = check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale, causal)
    (B, H, Nq, d), (_, Hkv, bs, _) = q.shape, k_cache.shape
    if bug == "caches_read_contiguous":
        k_cache, v_cache = as_if_contiguous(k_cache), as_if_contiguous(v_cache)
    if bug == "last_table_column_unread":  # the unread column points at block 0, which holds anything
        block_tables = torch.cat([block_tables[:, :-1], torch.zeros_like(block_tables[:, -1:])], dim=-1)
    if bug == "ignores_block_table":
        block_tables = torch.arange(block_tables.shape[1]).expand(B, -1) % k_cache.shape[0]  # (B, max_blocks)
    k, v = gather_kv(k_cache, block_tables), gather_kv(v_cache, block_tables)  # (B, Hkv, Nk, d)
    lens = -(-seq_lens // bs) * bs if bug == "reads_last_block_tail" else seq_lens
    ok = key_mask(lens, Nq, k.shape[2], causal)  # (B, 1, 1, Nq|1, Nk)
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d)
    s = (qg @ k[:, :, None].transpose(-1, -2) * scale).masked_fill(~ok, float("-inf"))  # (B, Hkv, G, Nq, Nk)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    if bug != "masks_scores_not_values":
        v = torch.where(ok.any(dim=3)[..., None], v[:, :, None], 0)  # (B, Hkv, 1, Nk, d)
    else:
        v = v[:, :, None]  # (B, Hkv, 1, Nk, d)
    if bug.startswith("v2_"):  # per-partition partials, then V2's reduce
        s, v = s.double(), v.double()  # garbage keys are -inf in s and 0 in v already
        parts = [partial(s[..., j:j + PARTITION], v[..., j:j + PARTITION, :]) for j in range(0, s.shape[-1], PARTITION)]
        if bug == "v2_reduce_max_from_zero":
            return reduce_from_zero(parts).to(q.dtype).reshape(B, H, Nq, d)  # (B, H, Nq, d)
        total = parts[0]
        for part in parts[1:]:
            total = merge_without_rescale(total, part)
        return finalize(total).to(q.dtype).reshape(B, H, Nq, d)  # (B, H, Nq, d)
    return (p @ v).reshape(B, H, Nq, d)  # (B, H, Nq, d)


def reduce_from_zero(parts) -> torch.Tensor:
    """The partials merged under M = max(0, m_i...), the max's initial 0 kept: once every e^(m_i - M)
    underflows, l = 0 and the row comes out 0, as a row that saw no key does."""
    top = torch.stack([part.m for part in parts]).amax(dim=0).clamp(min=0)  # (..., Nq)
    weights = [torch.exp(part.m - top) for part in parts]  # e^-inf = 0 for rows a partition doesn't see
    return finalize(Partial(top, sum(w * part.l for w, part in zip(weights, parts, strict=True)),
                            sum(w[..., None] * part.acc for w, part in zip(weights, parts, strict=True))))


for _bug, _what in BUGS.items():
    register("paged_attention", f"mutant_{_bug}", devices=("cpu", "cuda"), mutant=True, bug=_what,
             killed_by=KILLERS.get(_bug, ("matches_contiguous_attention",)))(
        lambda q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None, _bug=_bug:
        buggy_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, causal=causal, scale=scale, bug=_bug))
