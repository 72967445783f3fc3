"""FlexAttention behind the attention contract: the causal mask as a mask_mod over a block mask.

FlexAttention writes attention as softmax(score_mod(QK^T) masked by mask_mod) V and compiles the mods
into one fused kernel; a BlockMask lists, per (query block, key block), whether the block is empty,
full or partial, so empty blocks are skipped (the causal block skipping of FlashAttention, derived
from the mask).  Here mask_mod is the bottom-right causal rule, query i sees key j iff
j <= i + Nk - Nq.  Called eagerly, as the property suite calls it, flex_attention runs its unfused
reference path (the scores are materialised): a check of the mask and GQA semantics, not a fast
kernel; ``compiled=True`` calls `torch.compile(flex_attention)`, the fused kernel that
bench_attention.FlexCompiled times (the properties never pass it: one compile per shape).
Rows that see no key (Nq > Nk) are zeroed as the contract requires.  Dong et al. 2024,
"Flex Attention: A Programming Model for Generating Optimized Attention Kernels", Sec. 3.
"""

import functools
import warnings

import torch

from llm_inference_harness.contracts.attention import check_inputs, check_scores_budget
from llm_inference_harness.engine.registry import register


@register("attention", "flex", devices=("cpu", "cuda"),
          cite="Dong et al. 2024, Flex Attention, Sec. 3 (eager: unfused reference path)")
def flex(q, k, v, *, causal=False, scale=None, compiled=False):
    attention = compiled_flex_attention() if compiled else eager_flex_attention()
    return flex_call(q, k, v, causal=causal, scale=scale, attention=attention)


@functools.cache
def compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_call(q, k, v, *, causal, scale, attention):
    """attention = flex_attention, eager or compiled, called with the contract's masking and GQA."""
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), (Hkv, Nk) = q.shape, k.shape[1:3]
    if attention is eager_flex_attention():  # the unfused path materializes the scores
        check_scores_budget("attention flex", q, Nk, copies=2)
    if Nq == 0 or Nk == 0:  # nothing to attend over: every row is empty
        return q.new_zeros(B, H, Nq, d)
    mask = causal_block_mask(Nq, Nk, q.device) if causal else None
    out = attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=H != Hkv)  # (B, H, Nq, d)
    return out if not causal or Nq <= Nk else out.masked_fill(
        torch.arange(Nq, device=q.device)[:, None] < Nq - Nk, 0)  # rows with no visible key -> 0


@functools.cache
def eager_flex_attention():
    """flex_attention, with its "called without torch.compile" warning silenced: eager is the point here."""
    from torch.nn.attention.flex_attention import flex_attention

    def call(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return flex_attention(*args, **kwargs)
    return call


@functools.lru_cache(maxsize=64)
def causal_block_mask(Nq: int, Nk: int, device: torch.device):
    """The BlockMask of the bottom-right causal rule, built once per shape (building evaluates mask_mod)."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = Nk - Nq
    return create_block_mask(lambda b, h, i, j: j <= i + offset, None, None, Nq, Nk, device=device)
