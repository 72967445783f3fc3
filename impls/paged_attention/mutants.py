"""Known-wrong paged attention kernels, each gather-then-attend with one real bug switched on.

The tests fill every unused slot with NaN and shuffle the physical blocks, which is what makes these
bugs visible (as vLLM's kernel tests do).
"""

import torch

from llm_inference_harness.contracts.attention import check_scores_budget, score_dtype
from llm_inference_harness.contracts.paged_attention import check_inputs, key_mask
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.attention.mutants import as_if_contiguous, read_with_strides
from llm_inference_harness.impls.attention.mutants_splitk import merge_without_rescale
from llm_inference_harness.impls.paged_attention.gather import gather_kv
from llm_inference_harness.numerics.online_softmax import Partial, finalize, partial

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
    "v_cache_with_k_strides": "v_cache read with k_cache's strides, one kv_block_stride and kv_head_stride taken "
                              "from the key cache for both (vLLM's launchers): exact while both share a layout",
    "sniffs_key_cache_layout": "accepts vLLM's transposed key cache (num_blocks, Hkv, d, bs) too, sniffed from the "
                               "shape: when d == block_size the standard cache is read transposed",
    "tables_past_4096_unread": "a block table row staged in a 4096-entry buffer: blocks past 4096 read as block 0",
    "half_scores_unshifted": "the float16/bfloat16 path skips the max subtraction: exp overflows past 88 and a row "
                             "far below zero underflows to 0",
    "v2_reduce_forgets_last_max": "V2's reduce takes the global max over every partition but the last: softmax "
                                  "does not care until the last partition's max exceeds it by 88 (float32 exp "
                                  "overflows)",
    "scores_past_budget": "gathers and scores a sequence with no look at the memory budget: a 60,000-token "
                          "prefill tries to allocate 29 GB instead of raising",
}
KILLERS = {"v2_combine_unrescaled": ("decode_matches_contiguous_attention",),  # needs > 512 keys: long decodes
           "v2_reduce_max_from_zero": ("logits_far_below_zero",),
           "tables_past_4096_unread": ("decode_matches_contiguous_attention",),
           "half_scores_unshifted": ("large_logits_stay_finite_and_correct", "logits_far_below_zero"),
           "v2_reduce_forgets_last_max": ("large_logits_stay_finite_and_correct",),
           "scores_past_budget": ("rejects_bad_input",)}
HALF = (torch.float16, torch.bfloat16)


def buggy_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None, bug=""):
    scale = check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale, causal)
    (B, H, Nq, d), (_, Hkv, bs, _) = q.shape, k_cache.shape
    if bug != "scores_past_budget":
        check_scores_budget("paged_attention mutant", q, block_tables.shape[1] * bs, copies=2)  # as gather does
    if bug == "caches_read_contiguous":
        k_cache, v_cache = as_if_contiguous(k_cache), as_if_contiguous(v_cache)
    if bug == "v_cache_with_k_strides":
        v_cache = read_with_strides(v_cache, k_cache.stride())
    if bug == "sniffs_key_cache_layout" and bs == d:
        k_cache = k_cache.transpose(-1, -2)
    if bug == "tables_past_4096_unread":
        block_tables = block_tables.clone()
        block_tables[:, 4096:] = 0
    if bug == "last_table_column_unread":  # the unread column points at block 0, which holds anything
        block_tables = torch.cat([block_tables[:, :-1], torch.zeros_like(block_tables[:, -1:])], dim=-1)
    if bug == "ignores_block_table":
        block_tables = torch.arange(block_tables.shape[1]).expand(B, -1) % k_cache.shape[0]  # (B, max_blocks)
    k, v = gather_kv(k_cache, block_tables), gather_kv(v_cache, block_tables)  # (B, Hkv, Nk, d)
    lens = -(-seq_lens // bs) * bs if bug == "reads_last_block_tail" else seq_lens
    ok = key_mask(lens, Nq, k.shape[2], causal)  # (B, 1, 1, Nq|1, Nk)
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d)
    if bug in ("half_scores_unshifted", "v2_reduce_forgets_last_max"):  # float32 scores, as the kernels keep them
        qg, k, v = qg.to(score_dtype(q.dtype)), k.to(score_dtype(q.dtype)), v.to(score_dtype(q.dtype))
    s = (qg @ k[:, :, None].transpose(-1, -2) * scale).masked_fill(~ok, float("-inf"))  # (B, Hkv, G, Nq, Nk)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    if bug == "half_scores_unshifted" and q.dtype in HALF:
        p = torch.exp(s)
        l = p.sum(dim=-1, keepdim=True)  # noqa: E741
        p = torch.where(l == 0, 0, p / l)  # an underflowed row comes out 0; an overflowed one NaN
    if bug != "masks_scores_not_values":
        v = torch.where(ok.any(dim=3)[..., None], v[:, :, None], 0)  # (B, Hkv, 1, Nk, d)
    else:
        v = v[:, :, None]  # (B, Hkv, 1, Nk, d)
    if bug.startswith("v2_"):  # per-partition partials, then V2's reduce
        if bug != "v2_reduce_forgets_last_max":
            s, v = s.double(), v.double()  # garbage keys are -inf in s and 0 in v already
        parts = [partial(s[..., j:j + PARTITION], v[..., j:j + PARTITION, :]) for j in range(0, s.shape[-1], PARTITION)]
        if bug == "v2_reduce_max_from_zero":
            return reduce_from_zero(parts).to(q.dtype).reshape(B, H, Nq, d)  # (B, H, Nq, d)
        if bug == "v2_reduce_forgets_last_max":
            return reduce_without_last_max(parts).to(q.dtype).reshape(B, H, Nq, d)  # (B, H, Nq, d)
        total = parts[0]
        for part in parts[1:]:
            total = merge_without_rescale(total, part)
        return finalize(total).to(q.dtype).reshape(B, H, Nq, d)  # (B, H, Nq, d)
    return (p @ v).to(q.dtype).reshape(B, H, Nq, d)  # (B, H, Nq, d): float32 scores come back to q.dtype


def reduce_without_last_max(parts) -> torch.Tensor:
    """The partials merged under M = the max of every partition's m but the last one's (all of them when there is
    one): exact, softmax being shift-invariant, until e^(m_last - M) overflows."""
    top = torch.stack([part.m for part in parts[:-1] or parts]).amax(dim=0)  # (..., Nq)
    top = torch.where(torch.isfinite(top), top, 0)
    weights = [torch.exp(part.m - top) for part in parts]
    return finalize(Partial(top, sum(w * part.l for w, part in zip(weights, parts, strict=True)),
                            sum(w[..., None] * part.acc for w, part in zip(weights, parts, strict=True))))


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
