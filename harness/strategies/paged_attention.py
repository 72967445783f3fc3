"""Paged-attention cases (contract: harness/contracts/paged_attention.py): block tables, pools, a layout per
argument, ambiguous shapes, extreme logits in every dtype, tables past 4096 blocks."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from hypothesis import event
from hypothesis import strategies as st

from llm_inference_harness.engine.tolerance import dtype_of
from llm_inference_harness.strategies.attention import (
    AMBIGUITY,
    GRID_EDGES,
    LAYOUTS,
    PAST_GRID,
    extreme,
    half_safe_scales,
    laid_out,
    layout_events,
)
from llm_inference_harness.strategies.common import generator, head_counts, lengths, nonzero_scales, scales, seeds


@dataclass(frozen=True)
class PagedAttentionCase:
    B: int
    H: int
    Hkv: int
    Nq: int
    seq_lens: tuple[int, ...]
    d: int
    block_size: int
    spare_blocks: int  # pool blocks no sequence uses (NaN throughout; padding table entries may point there)
    causal: bool
    scale: float | None
    dtype: str
    seed: int
    device: str = "cpu"
    index_dtype: str = "int64"  # of block_tables and seq_lens: the contract allows int32 too
    magnitude: float = 1.0  # multiplies q: large values give logits of 1e3-1e4
    table_slack: int = 1  # table columns past the longest sequence's blocks; 0: it fills its table
    shared_blocks: int = 0  # leading blocks every sequence shares (a common prompt prefix stored once)
    meet: int = 0  # > 0: sequences 0 and 1 also share their block at depth shared() + meet, after different blocks
    layouts: tuple[str, ...] = ()  # memory layout of each of PAGED_ARGUMENTS (PAGED_LAYOUTS); missing: contiguous
    offset: float = 0.0  # subtracted from every logit through one extra head dim (q: -offset/scale, k: 1, v: 0)

    def shared(self) -> int:
        """How many leading blocks are shared: no more than the longest sequence has."""
        return min(self.shared_blocks, max(-(-n // self.block_size) for n in self.seq_lens))

    def met(self) -> int | None:
        """The depth of the block sequences 0 and 1 share after different blocks (two histories that meet), if both
        reach it: a kernel that takes shared blocks for a leading common prefix reads it wrong."""
        depth = self.shared() + self.meet
        blocks = [-(-n // self.block_size) for n in self.seq_lens[:2]]
        return depth if self.meet and len(blocks) == 2 and min(blocks) > depth else None

    def contiguous(self) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """q (B, H, Nq, d) and, per sequence, its contiguous k, v of shape (1, Hkv, seq_len, d): the first
        shared() * block_size keys of every sequence are one common prefix, and where sequences 0 and 1 meet (met())
        they hold the same keys in that block (d + 1 dims with an offset)."""
        g = generator(self.seed)
        q = torch.randn(self.B, self.H, self.Nq, self.d, generator=g, dtype=torch.float64) * self.magnitude
        prefix = torch.randn(2, 1, self.Hkv, self.shared() * self.block_size, self.d, generator=g, dtype=torch.float64)
        kv = [tuple(torch.cat([p[:, :, :n], torch.randn(1, self.Hkv, max(0, n - p.shape[2]), self.d, generator=g,
                                                         dtype=torch.float64)], dim=2) for p in prefix)
              for n in self.seq_lens]  # (1, Hkv, n, d) each
        if (depth := self.met()) is not None:
            bs = self.block_size
            start, ends = depth * bs, [min(n, (depth + 1) * bs) for n in self.seq_lens[:2]]
            longer = max(range(2), key=lambda b: ends[b])
            for b in range(2):
                for t, shared in zip(kv[b], kv[longer], strict=True):
                    t[:, :, start:ends[b]] = shared[:, :, start:ends[b]]  # (1, Hkv, <= bs, d): the met block
        if self.offset:  # q.k gains -offset / scale, so every logit moves by -offset; the output does not move
            scale = self.scale if self.scale is not None else (self.d + 1) ** -0.5
            q = torch.cat([q, torch.full((*q.shape[:-1], 1), -self.offset / scale, dtype=q.dtype)], dim=-1)
            kv = [(torch.cat([k, torch.ones_like(k[..., :1])], -1), torch.cat([v, torch.zeros_like(v[..., :1])], -1))
                  for k, v in kv]  # (1, Hkv, n, d + 1)
        cast = lambda t: t.to(dtype_of(self.dtype)).to(self.device)
        return cast(q), [(cast(k), cast(v)) for k, v in kv]

    def paged(self) -> tuple[torch.Tensor, ...]:
        """q, k_cache, v_cache (num_blocks, Hkv, block_size, d) with every unused slot NaN and the physical
        blocks in a shuffled order, block_tables (B, max_blocks) padded with arbitrary block ids, seq_lens (B,).
        The shared blocks are stored once and hold the whole prefix: a sequence that ends inside them finds
        finite keys of the others past its end."""
        q, kv = self.contiguous()
        bs, d, shared, depth = self.block_size, q.shape[-1], self.shared(), self.met()
        per_seq = [-(-n // bs) for n in self.seq_lens]
        own = [max(0, blocks - shared) for blocks in per_seq]
        num_blocks = shared + sum(own) + self.spare_blocks - (depth is not None)  # the met block is stored once
        g = generator(self.seed ^ 0xB10C)
        physical = torch.randperm(num_blocks, generator=g).tolist()
        k_cache = torch.full((num_blocks, self.Hkv, bs, d), float("nan"), dtype=q.dtype, device=q.device)
        v_cache = k_cache.clone()
        max_blocks = max(per_seq) + self.table_slack  # padding entries must never be read
        tables = torch.randint(0, num_blocks, (self.B, max_blocks), generator=g)
        common, physical = physical[:shared], physical[shared:]
        met = physical.pop() if depth is not None else None
        longest = max(range(self.B), key=lambda b: self.seq_lens[b])  # its keys fill the shared blocks
        for b, (k, v) in enumerate(kv):
            mine = own[b] - (depth is not None and b < 2)
            ids = common[:per_seq[b]] + physical[:mine]
            del physical[:mine]
            if depth is not None and b < 2:
                ids.insert(depth, met)
            ids = torch.tensor(ids)
            tables[b, :per_seq[b]] = ids
            for cache, t in ((k_cache, k), (v_cache, v)):
                padded = torch.full((self.Hkv, per_seq[b] * bs, d), float("nan"), dtype=q.dtype, device=q.device)
                padded[:, :self.seq_lens[b]] = t[0]  # (Hkv, blocks * bs, d), the tail of the last block NaN
                blocks = padded.reshape(self.Hkv, per_seq[b], bs, d).transpose(0, 1)  # (blocks, Hkv, bs, d)
                written = [j for j in range(0 if b == longest else min(shared, per_seq[b]), per_seq[b])
                           if j != depth or b >= 2 or self.seq_lens[b] >= self.seq_lens[1 - b]]  # shared: once
                cache[ids[written].to(q.device)] = blocks[written]
        index = getattr(torch, self.index_dtype)
        tables, seq_lens = tables.to(self.device, index), torch.tensor(self.seq_lens, dtype=index, device=self.device)
        return self.views(q, k_cache, v_cache, tables, seq_lens)

    def layout(self, name: str) -> str:
        i = PAGED_ARGUMENTS.index(name)
        return self.layouts[i] if i < len(self.layouts) else "contiguous"

    def views(self, q, k_cache, v_cache, tables, seq_lens) -> tuple[torch.Tensor, ...]:
        """The same values in the layouts a serving engine passes, each argument its own: q sliced from a
        (B, Nq, H, d) projection; a cache stored (num_blocks, bs, Hkv, d) (vLLM's flash layout), sliced from
        a larger pool, or one half of a (num_blocks, 2, Hkv, bs, d) pool (shared by both caches when both are
        "paired"); tables the first columns of wider persistent ones, or stored (max_blocks, B); seq_lens every
        other entry of a persistent buffer."""
        q = laid_out(q, self.layout("q"))
        caches = {"k_cache": k_cache, "v_cache": v_cache}
        if self.layout("k_cache") == self.layout("v_cache") == "paired":
            pool = torch.stack([k_cache, v_cache], dim=1)  # (num_blocks, 2, Hkv, bs, d)
            caches = {"k_cache": pool[:, 0], "v_cache": pool[:, 1]}
        for name, cache in caches.items():
            if self.layout(name) == "paired" and self.layout("k_cache") != self.layout("v_cache"):
                half = torch.full_like(cache, float("nan"))
                caches[name] = torch.stack([cache, half] if name == "k_cache" else [half, cache], dim=1)[
                    :, 0 if name == "k_cache" else 1]  # (num_blocks, Hkv, bs, d) of a NaN-padded pool
            elif self.layout(name) != "paired":
                caches[name] = laid_out(cache, self.layout(name))
        if self.layout("block_tables") == "wide":
            tables = torch.cat([tables, tables.flip(-1)], dim=-1)[:, :tables.shape[1]]  # valid ids past the view
        elif self.layout("block_tables") == "transposed":
            tables = tables.t().contiguous().t()  # (B, max_blocks) of (max_blocks, B) memory
        return q, caches["k_cache"], caches["v_cache"], tables, laid_out(seq_lens, self.layout("seq_lens"))


PAGED_ARGUMENTS = ("q", "k_cache", "v_cache", "block_tables", "seq_lens")
PAGED_LAYOUTS = {"q": LAYOUTS, "k_cache": (*LAYOUTS, "paired"), "v_cache": (*LAYOUTS, "paired"),
                 "block_tables": ("contiguous", "wide", "transposed"), "seq_lens": ("contiguous", "pooled")}
# Shapes a kernel sniffing its cache layout gets wrong: (.., d, bs) keys when bs == d, (nb, bs, Hkv, d) when
# bs == Hkv, (B, N, H, d) queries when Nq == H.  One draw in AMBIGUITY forces one.
PAGED_AMBIGUOUS = ("d == block_size", "block_size == Hkv", "Nq == H")


# Built once (a strategy built at every draw is validated again at every draw).
PAST_GRID_LENGTHS = st.one_of(st.sampled_from(GRID_EDGES[2:]), st.integers(4097, 5000))
SHARED_BLOCKS = st.one_of(st.just(0), st.integers(1, 3))
MEET = st.one_of(st.just(0), st.integers(1, 3))  # the depth, past the shared prefix, at which two histories meet


@functools.cache
def paged_head_dims(wide: bool) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([1, 8, 16, 64] + [96, 128, 256] * wide), st.integers(1, 80))


@functools.cache
def block_sizes(wide: bool) -> st.SearchStrategy[int]:
    # 1024: a block longer than a 512-token partition (V2's split), which must still be read whole
    return st.one_of(st.sampled_from([1, 2, 3, 8, 16, 32] + [128, 256, 1024] * wide), st.integers(1, 64))


@st.composite
def paged_attention_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
                          max_len: int = 200, min_len: int = 1, decode: bool | None = None,
                          magnitude: st.SearchStrategy[float] | None = None, wide: bool = True,
                          offset: st.SearchStrategy[float] | None = None,
                          past_grid: bool = False) -> PagedAttentionCase:
    """``wide``: real head groupings (head_counts), head dims 96-256 and blocks of 128, 256 and 1024 tokens as
    well (off for properties whose reference grows with H * Nq * Nk * d).  ``offset``: logits far below 0,
    with a nonzero scale (the offset is put in through it).  ``past_grid``: one draw in PAST_GRID is one
    decode of more than 4096 one-token blocks (a table past 4096 entries), with d <= 8.  ``min_len``: the first
    sequence holds at least that many tokens (e.g. past one 512-token partition of V2's split)."""
    H, Hkv = draw(head_counts(real_groups=wide))
    B = draw(st.integers(1, 3))
    first = lengths(max_len) if min_len <= 1 else st.integers(min_len, max_len)
    seq_lens = (draw(first), *draw(st.lists(lengths(max_len), min_size=B - 1, max_size=B - 1)))
    shortest = min(seq_lens)
    nq = st.just(1) if decode else st.one_of(st.just(1), st.integers(1, shortest), st.just(shortest))
    Nq = draw(nq if decode is not False else st.integers(1, shortest))
    d, block_size = draw(paged_head_dims(wide)), draw(block_sizes(wide))
    if past_grid and draw(st.integers(0, PAST_GRID - 1)) == PAST_GRID - 1:  # not 0: Hypothesis favours it (1 in 6 then)
        B, H, Hkv, Nq, block_size, d = 1, min(H, 2), 1, 1, 1, min(d, 8)
        seq_lens = (draw(PAST_GRID_LENGTHS),)
        event("size: a table past 4096 blocks")
    elif draw(st.integers(0, AMBIGUITY - 1)) == 0:
        forced = draw(st.sampled_from(PAGED_AMBIGUOUS))
        if forced == "d == block_size":
            d = block_size
        elif forced == "block_size == Hkv":
            block_size = Hkv
        elif decode is not True:  # Nq == H: a (B, H, Nq, d) query that also reads as (B, Nq, H, d)
            Nq = H = min(H, shortest)
            Hkv = Hkv if H % Hkv == 0 else 1
    for name, holds in zip(PAGED_AMBIGUOUS, (d == block_size > 1, block_size == Hkv > 1, Nq == H > 1), strict=True):
        if holds:
            event(f"shape: {name}")
    dtype = draw(st.sampled_from(dtypes))
    layouts = {name: draw(st.sampled_from(PAGED_LAYOUTS[name]), label=f"layout of {name}") for name in PAGED_ARGUMENTS}
    layout_events(layouts)
    case = PagedAttentionCase(
        B=B, H=H, Hkv=Hkv, Nq=Nq, seq_lens=seq_lens, d=d, block_size=block_size,
        spare_blocks=draw(st.integers(0, 3)), causal=draw(st.booleans()),
        scale=draw(scales if offset is None else half_safe_scales if dtype == "float16" else nonzero_scales),
        dtype=dtype, seed=draw(seeds), device=draw(st.sampled_from(devices)),
        index_dtype=draw(st.sampled_from(["int64", "int32"])), magnitude=extreme(draw, magnitude, dtype, "large"),
        table_slack=draw(st.integers(0, 2)), shared_blocks=draw(SHARED_BLOCKS),
        layouts=tuple(layouts[name] for name in PAGED_ARGUMENTS), offset=extreme(draw, offset, dtype, "far"),
        meet=draw(MEET, label="histories meet"),
    )
    if case.met() is not None:
        event("sharing: two sequences share a block past their common prefix, after different blocks")
    return case


@st.composite
def paged_attention_blind_row_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",),
                                    devices: tuple[str, ...] = ("cpu",)) -> PagedAttentionCase:
    """Causal chunks of Nq queries longer than the shortest sequence: its first Nq - seq_len rows see no key."""
    case = draw(paged_attention_cases(dtypes=dtypes, devices=devices, max_len=60, decode=False))
    return PagedAttentionCase(**{**vars(case), "Nq": min(case.seq_lens) + draw(st.integers(1, 8)), "causal": True})
