"""The paged-attention contract: attention over K/V stored in fixed-size blocks of a shared pool.

    paged_attention(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None) -> Tensor

* q: (B, H, Nq, d) -- Nq = 1 is decode, Nq > 1 prefill (or a chunk of it).
* k_cache, v_cache: (num_blocks, Hkv, block_size, d), H divisible by Hkv (query head h reads kv head
  h // (H // Hkv)).
* block_tables: (B, max_blocks) int32 or int64; sequence b's key j lives at
  k_cache[block_tables[b, j // block_size], :, j % block_size].  Every entry is a valid block index,
  also past a sequence's last block (pad with any block, e.g. 0, not -1).
* seq_lens: (B,) int32 or int64, 1 <= seq_lens[b] <= max_blocks * block_size.  Slots past seq_lens[b]
  in the last block, and the blocks that table entries past its last block point to, hold garbage (NaN
  in the tests): never let them reach the output.
* Per sequence the result is the attention contract's softmax(q k^T * scale) v over its seq_lens[b]
  keys, causal aligned bottom-right (query i sees key j iff j <= i + seq_lens[b] - Nq); a query row that
  sees no key returns zeros.  The output has q's shape, dtype and device; inputs are left unchanged.
* Every argument may be a strided view, each its own: q sliced from a (B, Nq, H, d) projection; k_cache and
  v_cache with different strides (either stored (num_blocks, block_size, Hkv, d), as vLLM's flash layout, one
  half of a (num_blocks, 2, Hkv, block_size, d) pool, or a slice of a larger one); the tables the first columns
  of wider persistent ones, or stored (max_blocks, B); seq_lens every other entry of a persistent buffer.  No
  layout may be inferred from the shape (d == block_size, block_size == Hkv are legal shapes of this one).
  Sequences may share physical blocks -- a common prefix stored once, or a later block that two histories
  hold at the same depth after different blocks --, and a sequence may fill its table;
  a table may hold more than 4096 blocks.
* block_size (k_cache's dim 2) >= 1: 0 is a ValueError naming k_cache.  Every tensor argument on q's device,
  else ValueError naming it; the output on q's device.
* Memory budget: as attention's (harness/contracts/attention.py): an implementation that materializes a
  sequence's (Nq, Nk) scores (not declaring ``tiled``) refuses, before allocating, a call whose scores exceed
  MEMORY_BUDGET, with a ValueError naming Nq and Nk.
* Rounding: as attention's contract admits it, per sequence; V2's 512-token partitions are one level of them.
* causal must be a bool.  B, H and Nq may be 0 (an empty batch or query chunk): the output is empty.
Kwon et al. 2023, "Efficient Memory Management for LLM Serving with PagedAttention", Sec. 4.1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from llm_inference_harness.contracts import Rule, Technique, batch_rules, define
from llm_inference_harness.contracts.attention import check_causal, on_device_of, same_device
from llm_inference_harness.engine.capabilities import BatchedCaps, cap
from llm_inference_harness.engine.guard import call_limit, check_tensor, guarded_call

if TYPE_CHECKING:  # the registry imports the contracts: they name its record for type checking only
    from llm_inference_harness.engine.registry import Impl


@dataclass(frozen=True)
class PagedAttentionCaps(BatchedCaps):
    partition_tokens: int | None = cap(None, "keys per partition of a split-K (vLLM v2) kernel; None: one pass")
    compiled: bool = cap(False, "a compiled C kernel whose loop order is fixed by logical key order")
    tiled: bool = cap(False, "works block by block, never materializing a sequence's (Nq, Nk) scores (else it "
                             "refuses a call past the memory budget)")

PAGED_ATTENTION = define(
    Technique(
        name="paged_attention",
        signature="paged_attention(q, k_cache, v_cache, block_tables, seq_lens, *, causal: bool = False, "
                  "scale: float | None = None) -> Tensor",
        summary="exact attention over K/V gathered through per-sequence block tables (vLLM PagedAttention)",
        properties=("llm_inference_harness.properties.test_paged_attention",
                    "llm_inference_harness.properties.test_paged_attention_compiled",
                    "llm_inference_harness.properties.test_paged_attention_batch"),
        reference="",
        caps=PagedAttentionCaps,
        rules=(
            Rule("output", "per sequence, the attention contract's output over its seq_lens[b] keys read through its "
                           "block table; what unused slots hold never reaches it",
                 ("matches_contiguous_attention", "decode_matches_contiguous_attention")),
            Rule("placement", "the result does not depend on which physical blocks hold a sequence, on the layout "
                              "of its arguments or on the thread count",
                 ("bits_do_not_depend_on_placement_or_threads", "strided_inputs_and_int32_tables")),
            Rule("large logits", "scores of any magnitude give a finite output within the earned bound",
                 ("large_logits_stay_finite_and_correct", "logits_far_below_zero")),
            Rule("empty shapes", "an empty batch, head group or query chunk gives an empty output; a query row that "
                                 "sees no key returns zeros",
                 ("empty_shapes_give_empty_output", "rows_that_see_no_key_are_zero")),
            Rule("bad input", "tables, lengths and caches that break the contract raise ValueError/TypeError naming "
                              "the argument", ("rejects_bad_input",)),
            *batch_rules("query_chunks_are_invariant"),
        ),
    )
)


def check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale=None, causal=False) -> float:
    """Validate the contract's inputs; return the effective scale. Raises ValueError/TypeError naming the argument."""
    check_causal(causal, "paged_attention")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"paged_attention: {name} must be a floating-point torch.Tensor")
        if t.dim() != 4:
            raise ValueError(f"paged_attention: {name} must have 4 dims, got shape {tuple(t.shape)}")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"paged_attention: {name} must be an int32 or int64 torch.Tensor, got {got}")
    same_device("paged_attention", q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens)
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"paged_attention: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")
    (B, H, _, d), (num_blocks, Hkv, block_size, dk) = q.shape, k_cache.shape
    if dk != d:
        raise ValueError(f"paged_attention: k_cache has head dim {dk} but q has {d}")
    if d == 0:
        raise ValueError("paged_attention: q's head dim d must be at least 1, got 0")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"paged_attention: q's {H} heads must be a multiple of k_cache's {Hkv} heads")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"paged_attention: q, k_cache, v_cache must share a dtype, got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")
    if block_size == 0:  # else every seq_lens would look too long for its table
        raise ValueError("paged_attention: k_cache's block_size (dim 2) must be at least 1, got 0")
    if block_tables.dim() != 2 or block_tables.shape[0] != B:
        raise ValueError(f"paged_attention: block_tables must be (B={B}, max_blocks), got {tuple(block_tables.shape)}")
    if tuple(seq_lens.shape) != (B,):
        raise ValueError(f"paged_attention: seq_lens must have shape ({B},), got {tuple(seq_lens.shape)}")
    if block_tables.numel() and not bool(((block_tables >= 0) & (block_tables < num_blocks)).all()):
        raise ValueError(f"paged_attention: block_tables entries must lie in [0, {num_blocks})")
    capacity = block_tables.shape[1] * block_size
    if not bool(((seq_lens >= 1) & (seq_lens <= capacity)).all()):
        raise ValueError(f"paged_attention: seq_lens must lie in [1, {capacity}] (max_blocks * block_size), "
                         f"got {seq_lens.tolist()}")
    if scale is None:
        return d ** -0.5
    if not (isinstance(scale, int | float) and math.isfinite(scale)):
        raise ValueError(f"paged_attention: scale must be a finite float or None, got {scale!r}")
    return float(scale)


def key_mask(seq_lens, Nq: int, Nk: int, causal: bool, offset: int = 0):
    """Bool (B, 1, 1, Nq, Nk) mask of the keys offset..offset+Nk-1 each query may see: inside its
    sequence, and on or below the bottom-right causal diagonal."""
    j = offset + torch.arange(Nk, device=seq_lens.device)  # (Nk,)
    L = seq_lens[:, None, None]  # (B, 1, 1)
    ok = j[None, None, :] < L  # (B, 1, Nk)
    if causal:
        i = torch.arange(Nq, device=seq_lens.device)[None, :, None]  # (1, Nq, 1)
        ok = ok & (j[None, None, :] <= i + L - Nq)  # (B, Nq, Nk)
    return ok[:, None, None]  # (B, 1, 1, Nq or 1, Nk)


def call(impl: Impl, q, k_cache, v_cache, block_tables, seq_lens, *, causal: bool, scale: float | None):
    """Call an implementation under guard and check the promised output."""
    out = guarded_call(impl.fn, q, k_cache, v_cache, block_tables, seq_lens, causal=causal, scale=scale,
                       arg_names=("q", "k_cache", "v_cache", "block_tables", "seq_lens"), timeout_s=call_limit(impl))
    return on_device_of(q, check_tensor(out, what=f"{impl.name} output", shape=tuple(q.shape), dtype=q.dtype,
                                        device=q.device), f"{impl.name} output")
