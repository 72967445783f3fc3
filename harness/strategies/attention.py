"""Attention cases (contract: harness/contracts/attention.py): shapes at tile edges, GQA groupings, scales, a
memory layout per argument, ambiguous shapes, extreme logits in every dtype, sizes past the usual grids."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from hypothesis import event
from hypothesis import strategies as st

from llm_inference_harness.contracts.attention import MEMORY_BUDGET, score_dtype
from llm_inference_harness.engine.tolerance import dtype_of
from llm_inference_harness.strategies.common import generator, head_counts, lengths, nonzero_scales, scales, seeds

ARGUMENTS = ("q", "k", "v", "o", "lse", "do")  # the tensors of a forward (q, k, v) and of a backward call
LAYOUTS = ("contiguous", "transposed", "pooled")


def laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values in another memory layout: "transposed" swaps dims 1 and 2 in memory (the heads of a
    (B, N, H, d) projection; an lse stored (B, Nq, H)); "pooled" is a slice of a larger pool, with an offset
    and every stride padded, whose other slots hold NaN (0 for integers): a persistent buffer, FlashAttention's
    lse padded to whole row blocks.  A 1-d tensor is pooled as every other entry of its pool."""
    if layout == "transposed" and t.dim() >= 3:
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "pooled":
        fill = float("nan") if t.is_floating_point() else 0
        if t.dim() == 1:
            view = t.new_full((2 * t.shape[0] + 1,), fill)[1::2]  # (n,) of stride 2
        else:
            view = t.new_full([n + 2 for n in t.shape], fill)[tuple(slice(1, n + 1) for n in t.shape)]
        return view.copy_(t)
    return t.contiguous()


@dataclass(frozen=True)
class AttentionCase:
    B: int
    H: int
    Hkv: int
    Nq: int
    Nk: int
    d: int
    causal: bool
    scale: float | None
    dtype: str
    seed: int
    magnitude: float = 1.0  # multiplies q: large values give logits of 1e3-1e4
    device: str = "cpu"
    layouts: tuple[str, ...] = ()  # memory layout of each of ARGUMENTS (LAYOUTS); missing ones are contiguous
    offset: float = 0.0  # subtracted from every logit through one extra head dim (q: -offset/scale, k: 1, v: 0)
    climb: float = 0.0  # added per key to the logits of even query rows (an extra head dim: q climb/scale, k j, v 0)

    @property
    def width(self) -> int:
        """The head dim of the tensors: d, one more for an offset, one more for a climb."""
        return self.d + bool(self.offset) + bool(self.climb)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, Nq, width), k and v (B, Hkv, Nk, width), each in its own layout."""
        g = generator(self.seed)
        q = torch.randn(self.B, self.H, self.Nq, self.d, generator=g, dtype=torch.float64) * self.magnitude
        k = torch.randn(self.B, self.Hkv, self.Nk, self.d, generator=g, dtype=torch.float64)
        v = torch.randn(self.B, self.Hkv, self.Nk, self.d, generator=g, dtype=torch.float64)
        scale = self.scale if self.scale is not None else self.width ** -0.5
        if self.offset:  # q.k gains -offset / scale, so every logit moves by -offset; the output does not move
            q = torch.cat([q, torch.full((*q.shape[:-1], 1), -self.offset / scale, dtype=q.dtype)], dim=-1)
            k, v = torch.cat([k, torch.ones_like(k[..., :1])], -1), torch.cat([v, torch.zeros_like(v[..., :1])], -1)
        if self.climb:  # even rows' logits rise by climb at each key: their max moves at every key block, odd rows' not
            rises = (torch.arange(self.Nq) % 2 == 0).double()[:, None] * (self.climb / scale)  # (Nq, 1)
            q = torch.cat([q, rises.expand(*q.shape[:-1], 1)], dim=-1)
            keys = torch.arange(self.Nk, dtype=torch.float64)[:, None].expand(*k.shape[:-1], 1)  # (B, Hkv, Nk, 1)
            k, v = torch.cat([k, keys], -1), torch.cat([v, torch.zeros_like(v[..., :1])], -1)
        return tuple(self.laid_out(t, name) for t, name in zip((q, k, v), ARGUMENTS, strict=False))

    def layout(self, name: str) -> str:
        i = ARGUMENTS.index(name)
        return self.layouts[i] if i < len(self.layouts) else "contiguous"

    def laid_out(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """t, the argument ``name``, in the case's device and that argument's layout; floating point tensors
        other than lse in the case's dtype (the same values either way)."""
        if name != "lse":
            t = t.to(dtype_of(self.dtype))
        return laid_out(t.to(self.device), self.layout(name))


def layout_events(layouts: dict[str, str]) -> None:
    """Count, under --hypothesis-show-statistics, the layouts that related arguments rarely share by accident."""
    for name, layout in layouts.items():
        if layout != "contiguous":
            event(f"layout: {name} {layout}")
    pairs = [(a, b) for a, b in (("q", "k"), ("k", "v"), ("o", "do"), ("k_cache", "v_cache")) if {a, b} <= set(layouts)]
    for a, b in pairs:
        if layouts[a] != layouts[b]:
            event(f"layout: {a} and {b} differ")


# Coincidences a kernel that sniffs its layout from the shape gets wrong (keys transposed when Nk == d; heads and
# positions swapped when N == H; square self-attention when Nq == Nk; MHA when H == Hkv): one in AMBIGUITY
# draws forces one of them, so every property that takes the tensors meets each in a few percent of its draws.
AMBIGUITY = 6
AMBIGUOUS = ("Nk == d", "Nq == Nk", "Nq == H", "Nk == Hkv", "H == Hkv")


# Built once per bound (and per Nk): a strategy built anew at every draw is validated again at every draw.
@functools.lru_cache(maxsize=4096)
def query_lengths(max_len: int, Nk: int) -> st.SearchStrategy[int]:
    return st.one_of(st.just(1), lengths(max_len), st.just(Nk))  # decode, Nq != Nk, square


@functools.cache
def head_dims(max_d: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([1, 3, 8, 16, 59, 64, 111, 128]), st.integers(1, max_d))


@st.composite
def shapes(draw: st.DrawFn, max_len: int = 300, max_d: int = 128, ambiguous: bool = False,
           ) -> tuple[int, int, int, int, int]:
    """(H, Hkv, Nq, Nk, d): lengths at tile edges, decode, square, GQA groupings, and the ambiguous shapes (every
    draw one of them when ``ambiguous``)."""
    H, Hkv = draw(head_counts())
    Nk = draw(lengths(max_len))
    Nq = draw(query_lengths(max_len, Nk))
    d = draw(head_dims(max_d))
    if ambiguous or draw(st.integers(0, AMBIGUITY - 1)) == 0:
        forced = draw(st.sampled_from(AMBIGUOUS))
        if forced == "Nk == d":
            Nk = d = min(max(Nk, 2), max_len, max_d)
        elif forced == "Nq == Nk":
            Nq = Nk
        elif forced == "Nq == H":
            Nq = H = min(max(H, 2), max_len) // Hkv * Hkv or Hkv
        elif forced == "Nk == Hkv":
            Nk = min(Hkv, max_len)
        else:
            Hkv = H
    for name, holds in zip(AMBIGUOUS, (Nk == d > 1, Nq == Nk, Nq == H > 1, Nk == Hkv > 1, H == Hkv), strict=True):
        if holds:
            event(f"shape: {name}")
    return H, Hkv, Nq, Nk, d


@st.composite
def attention_cases(
    draw: st.DrawFn,
    dtypes: tuple[str, ...] = ("float64",),
    devices: tuple[str, ...] = ("cpu",),
    max_len: int = 300,
    causal: bool | None = None,
    magnitude: st.SearchStrategy[float] | None = None,
    max_d: int = 128,
    offset: st.SearchStrategy[float] | None = None,
    arguments: tuple[str, ...] = ARGUMENTS[:3],
    ambiguous: bool = False,
) -> AttentionCase:
    """``magnitude`` / ``offset``: logits of 1e3-1e4 / every logit far below 0 (a nonzero scale then, one that
    keeps -offset/scale finite in float16).  ``arguments``: the tensors that get a layout drawn.  ``ambiguous``:
    every draw has one of the AMBIGUOUS shapes."""
    H, Hkv, Nq, Nk, d = draw(shapes(max_len, max_d, ambiguous))
    dtype = draw(st.sampled_from(dtypes))
    scale = draw(scales if offset is None else half_safe_scales if dtype == "float16" else nonzero_scales)
    layouts = {name: draw(st.sampled_from(LAYOUTS), label=f"layout of {name}") for name in arguments}
    layout_events(layouts)
    return AttentionCase(
        B=draw(st.integers(1, 2)), H=H, Hkv=Hkv, Nq=Nq, Nk=Nk, d=d,
        causal=draw(st.booleans()) if causal is None else causal, scale=scale, dtype=dtype, seed=draw(seeds),
        magnitude=extreme(draw, magnitude, dtype, "large"), device=draw(st.sampled_from(devices)),
        layouts=tuple(layouts.get(name, "contiguous") for name in ARGUMENTS),
        offset=extreme(draw, offset, dtype, "far"),
    )


# float16 holds values below 65504: a q of N(0, 1) x 5e3 stays clear of it (and of q.k's overflow in float32 too);
# -offset/scale of an offset <= 3000 needs |scale| >= 0.05 (1/sqrt(d + 1) is, for d <= 256).
HALF_MAGNITUDE = 5e3
half_safe_scales = st.one_of(st.none(), st.floats(0.05, 2.0), st.floats(-2.0, -0.05))


def extreme(draw: st.DrawFn, values: st.SearchStrategy[float] | None, dtype: str, kind: str) -> float:
    """A drawn logit magnitude (kind "large", default 1) or offset ("far", default 0), counted as an event."""
    if values is None:
        return 1.0 if kind == "large" else 0.0
    x = draw(values)
    if kind == "large" and dtype == "float16":
        x = min(x, HALF_MAGNITUDE)
    event(f"logits: {'~1e3-1e4' if kind == 'large' else 'far below 0'} in {dtype}")
    return x


# Past the block and grid sizes kernels are written around (512-key partitions, 1024 threads, 4096-key grids):
# one in PAST_GRID long draws has this many keys (or queries), with small other dims to keep it cheap.
PAST_GRID = 8
GRID_EDGES = (4095, 4096, 4097, 5000)


@st.composite
def long_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
               max_len: int = 1100, max_d: int = 256, long_queries: bool = False,
               arguments: tuple[str, ...] = ARGUMENTS[:3], climbing: bool = False) -> AttentionCase:
    """Up to 8 queries against many keys (decode, a speculative verify): past the 512-key partitions of
    split-K decoding and the 128-key tiles of FlashAttention, with head dims up to 256 (past the 128 that
    kernels specialise for); one draw in PAST_GRID goes past 4096 keys, with d <= 16 and at most 4 queries.
    ``long_queries``: half the time many queries against few keys instead (dK and dV summed over query tiles).
    ``climbing``: half the draws past the grid have logits that climb steeply along the keys on every other query
    row (as a linear recency bias makes them), at least two rows: those rows' max moves at every key block of
    every tile size, the other rows' never -- a kernel that shifts or rescales a row it need not drifts there."""
    case = draw(attention_cases(dtypes=dtypes, devices=devices, max_len=8, arguments=arguments))
    past_grid = draw(st.integers(0, PAST_GRID - 1)) == 0
    if past_grid:
        n = draw(PAST_GRID_LENGTHS)
        d = draw(st.integers(1, 16))
        event("size: past 4096 keys (or queries)")
    else:
        n, d = draw(long_lengths(max_len)), draw(wide_head_dims(max_d))
    small = {"B": 1, "Nq": min(case.Nq, 4), "Nk": min(case.Nk, 4)} if past_grid else {}
    if past_grid and climbing and draw(st.booleans()):  # climb / scale must be finite, in float16 too
        scale = draw(half_safe_scales if case.dtype == "float16" else nonzero_scales)
        small |= {"Nq": max(2, small["Nq"]), "climb": draw(st.sampled_from([0.5, 2.0])), "scale": scale}
        event("logits: climbing along the keys on every other row")
    along = "Nq" if long_queries and draw(st.booleans()) else "Nk"
    return AttentionCase(**{**case.__dict__, **small, along: n, "d": d})


PAST_GRID_LENGTHS = st.one_of(st.sampled_from(GRID_EDGES), st.integers(4097, 5000))


@functools.cache
def long_lengths(max_len: int) -> st.SearchStrategy[int]:
    edges = [n for n in (129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025) if n <= max_len]
    return st.one_of(st.sampled_from(edges), st.integers(129, max_len))


@functools.cache
def wide_head_dims(max_d: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([d for d in (1, 128, 129, 192, 256) if d <= max_d]), st.integers(1, max_d))


# (m, l, acc) partials of the online-softmax merge: scores of a few disjoint key blocks.
@st.composite
def score_blocks(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Scores (N, J) with some -inf (masked) entries, values (J, d) and a split of J into blocks."""
    N, J, d = draw(st.integers(1, 6)), draw(st.integers(1, 40)), draw(st.integers(1, 8))
    g = generator(draw(seeds))
    s = torch.randn(N, J, generator=g, dtype=torch.float64) * draw(st.sampled_from([1.0, 30.0, 1e3]))
    s[torch.rand(N, J, generator=g, dtype=torch.float64) < draw(st.sampled_from([0.0, 0.3, 1.0]))] = float("-inf")
    cuts = sorted(draw(st.sets(st.integers(1, J - 1), max_size=min(5, J - 1)))) if J > 1 else []
    return s, torch.randn(J, d, generator=g, dtype=torch.float64), [0, *cuts, J]


EMPTY_SHAPES = {  # (q, k/v shape): an empty batch or head group, a prefill chunk of no tokens, no cache yet
    "B=0": ((0, 2, 4, 8), (0, 2, 4, 8)),
    "H=0": ((1, 0, 4, 8), (1, 1, 4, 8)),
    "Nq=0": ((1, 2, 0, 8), (1, 2, 4, 8)),
    "Nk=0": ((1, 2, 4, 8), (1, 2, 0, 8)),
}
BAD_CAUSAL = ("no", 0.5, None)  # causal values that must raise: a string, a float, None


PAST_BUDGET_TOKENS = 60_000  # Nq = Nk: a (60000, 60000) float32 score matrix is 14.4 GB, far past MEMORY_BUDGET


def just_past_budget(dtype: torch.dtype, multiple: int = 1) -> int:
    """The fewest tokens n (a multiple of ``multiple``) whose one (n, n) score matrix, in the contract's score dtype
    for inputs of ``dtype``, is past MEMORY_BUDGET: every implementation that materializes the scores must refuse
    it, and one that counts them short (a block size or a copy short) does not."""
    size = torch.empty((), dtype=score_dtype(dtype)).element_size()
    return multiple * (int((MEMORY_BUDGET / size) ** 0.5) // multiple + 1)
