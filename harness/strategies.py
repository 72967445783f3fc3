"""Hypothesis strategies, one typed module for every technique.

Strategies build valid inputs directly (no `assume`): shapes are drawn so that every constraint
of the contract already holds.  Tensor values come from a drawn seed, so a shrunk counterexample
prints as a small readable record that regenerates the exact tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from harness.tolerance import dtype_of

# ---------------------------------------------------------------------------------------------
# shared
seeds = st.integers(min_value=0, max_value=2**31 - 1)
# Tile edges of the block sizes we register, +-1: where partial-tile and diagonal bugs live.
TILE_EDGES = sorted({n for b in (16, 17, 24, 32, 33, 40, 48, 64, 80, 128, 256) for n in (b - 1, b, b + 1)})


def lengths(max_len: int = 300) -> st.SearchStrategy[int]:
    edges = [n for n in TILE_EDGES if 1 <= n <= max_len]
    return st.one_of(st.sampled_from([1, 2, *edges]), st.integers(1, max_len))


@st.composite
def head_counts(draw: st.DrawFn, real_groups: bool = False) -> tuple[int, int]:
    """(H, Hkv) with Hkv dividing H, H <= 6: MHA, MQA and groups of 2, 3 and 4 query heads per kv head (a
    group of 3 catches kernels that assume a power of two, h >> log2(G)).  ``real_groups``: a quarter of
    the draws are real models' groupings instead (Llama-3 8B's 32/8 scaled down: 8/2, 12/3, 16/4), where a
    kernel's packed path for groups of 4 or more meets more than one kv head."""
    if real_groups and draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from([(8, 2), (12, 3), (16, 4)]))
    Hkv = draw(st.integers(1, 4))
    return Hkv * draw(st.sampled_from([g for g in (1, 2, 3, 4) if Hkv * g <= 6])), Hkv


# None (1/sqrt(d)), 0 (uniform weights: `scale or 1/sqrt(d)` reads it as None), a value in [0.01, 2], or a
# negative one (the contract allows any finite scale: a kernel taking |scale| is wrong there)
nonzero_scales = st.one_of(st.none(), st.floats(0.01, 2.0), st.floats(-2.0, -0.01))
scales = st.one_of(st.none(), st.just(0.0), st.floats(0.01, 2.0), st.floats(-2.0, -0.01))


def generator(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# attention
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
    layout: str = "BHNd"  # or "BNHd": (B, N, H, d) memory seen as (B, H, N, d), as a projection's heads are

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = generator(self.seed)
        q = torch.randn(self.B, self.H, self.Nq, self.d, generator=g, dtype=torch.float64) * self.magnitude
        k = torch.randn(self.B, self.Hkv, self.Nk, self.d, generator=g, dtype=torch.float64)
        v = torch.randn(self.B, self.Hkv, self.Nk, self.d, generator=g, dtype=torch.float64)
        return tuple(self.laid_out(t) for t in (q, k, v))

    def laid_out(self, t: torch.Tensor) -> torch.Tensor:
        """t in the case's dtype, device and memory layout (the same values either way)."""
        t = t.to(dtype_of(self.dtype)).to(self.device)
        return t.transpose(1, 2).contiguous().transpose(1, 2) if self.layout == "BNHd" else t  # strides of (B, N, H, d)


@st.composite
def attention_cases(
    draw: st.DrawFn,
    dtypes: tuple[str, ...] = ("float64",),
    devices: tuple[str, ...] = ("cpu",),
    max_len: int = 300,
    causal: bool | None = None,
    magnitude: st.SearchStrategy[float] | None = None,
    max_d: int = 128,
) -> AttentionCase:
    H, Hkv = draw(head_counts())
    Nk = draw(lengths(max_len))
    Nq = draw(st.one_of(st.just(1), lengths(max_len), st.just(Nk)))  # decode, Nq != Nk, square
    d = draw(st.one_of(st.sampled_from([1, 3, 8, 16, 59, 64, 111, 128]), st.integers(1, max_d)))
    return AttentionCase(
        B=draw(st.integers(1, 2)), H=H, Hkv=Hkv, Nq=Nq, Nk=Nk, d=d,
        causal=draw(st.booleans()) if causal is None else causal,
        scale=draw(scales), dtype=draw(st.sampled_from(dtypes)), seed=draw(seeds),
        magnitude=draw(magnitude) if magnitude is not None else 1.0,
        device=draw(st.sampled_from(devices)), layout=draw(st.sampled_from(["BHNd", "BNHd"])),
    )


@st.composite
def long_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
               max_len: int = 1100, max_d: int = 256, long_queries: bool = False) -> AttentionCase:
    """Up to 8 queries against many keys (decode, a speculative verify): past the 512-key partitions of
    split-K decoding and the 128-key tiles of FlashAttention, with head dims up to 256 (past the 128 that
    kernels specialise for).  ``long_queries``: half the time many queries against few keys instead (dK and
    dV summed over query tiles)."""
    case = draw(attention_cases(dtypes=dtypes, devices=devices, max_len=8))
    n = draw(st.one_of(st.sampled_from([n for n in (129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025)
                                        if n <= max_len]), st.integers(129, max_len)))
    d = draw(st.one_of(st.sampled_from([d for d in (1, 128, 129, 192, 256) if d <= max_d]), st.integers(1, max_d)))
    return AttentionCase(**{**case.__dict__, "Nq" if long_queries and draw(st.booleans()) else "Nk": n, "d": d})


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


# ---------------------------------------------------------------------------------------------
# attention_backward
def output_grad(case: AttentionCase) -> torch.Tensor:
    """dO for a backward case, in q's shape/dtype/device: a fixed function of the case's seed, so a
    printed counterexample regenerates it."""
    g = generator(case.seed ^ 0x5EED)
    return case.laid_out(torch.randn(case.B, case.H, case.Nq, case.d, generator=g, dtype=torch.float64))


@st.composite
def fully_masked_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
                       max_len: int = 120) -> AttentionCase:
    """Causal cases with Nq > Nk: the first Nq - Nk query rows see no key at all."""
    case = draw(attention_cases(dtypes=dtypes, devices=devices, max_len=max_len - 1, causal=True))
    extra = draw(st.integers(1, max_len - case.Nk))
    return AttentionCase(**{**case.__dict__, "Nq": case.Nk + extra})


# ---------------------------------------------------------------------------------------------
# block_manager
TOKEN_ALPHABET = 3  # few distinct tokens, so equal blocks under different prefixes come up often


@dataclass(frozen=True)
class PoolGeometry:
    block_size: int
    num_blocks: int
    num_cpu_blocks: int


def pool_geometries() -> st.SearchStrategy[PoolGeometry]:
    """Pools of 2-12 blocks (a prompt takes at most 5), so that sequences fit, share blocks, run out, evict and
    reuse evicted blocks; one pool in eight has 0 or 1 block, where nearly every request runs out."""
    num_blocks = st.sampled_from([False] * 7 + [True]).flatmap(
        lambda tiny: st.integers(0, 1) if tiny else st.integers(2, 12))
    return st.builds(PoolGeometry, st.sampled_from([1, 2, 3, 4]), num_blocks, st.integers(0, 6))


def token_lists(block_size: int, min_size: int = 1) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, TOKEN_ALPHABET - 1), min_size=min_size, max_size=4 * block_size + 1)


@st.composite
def prompts(draw: st.DrawFn, history: list[list[int]], block_size: int) -> list[int]:
    """A prompt: fresh; a prefix of one of ``history`` (earlier prompts, live sequences' tokens after appends and
    forks) cut mostly at a block boundary, plus new tokens; or one of ``history`` with one token of its first
    block changed -- equal later blocks under another prefix."""
    kind = draw(st.sampled_from(["fresh", "shared_prefix", "other_prefix"] if history else ["fresh"]))
    if kind == "fresh":
        return draw(token_lists(block_size))
    base = draw(st.sampled_from(list(history)))
    if kind == "shared_prefix":
        cut = draw(st.one_of(st.sampled_from(range(0, len(base) + 1, block_size)), st.integers(0, len(base))))
        return base[:cut] + draw(token_lists(block_size, min_size=0 if cut else 1))
    j = draw(st.integers(0, min(block_size, len(base)) - 1))
    return [*base[:j], (base[j] + 1) % TOKEN_ALPHABET, *base[j + 1:]]


@st.composite
def appended_tokens(draw: st.DrawFn, current: list[int], sources: list[list[int]], block_size: int,
                    min_size: int = 1) -> list[int]:
    """Up to two blocks' worth of tokens to append to a sequence holding ``current``: random, or, where one of
    ``sources`` extends ``current``, its next tokens -- a decode that reproduces another request's tokens, so the
    blocks it fills duplicate cached ones (the cache keeps one of them) and hash chains run through them."""
    n = len(current)
    ahead = sorted({tuple(s[n:]) for s in sources if len(s) > n and s[:n] == current})
    if ahead and draw(st.booleans()):
        return list(draw(st.sampled_from(ahead)))[:draw(st.integers(max(min_size, 1), 2 * block_size))]
    return draw(st.lists(st.integers(0, TOKEN_ALPHABET - 1), min_size=min_size, max_size=2 * block_size))


@dataclass(frozen=True)
class EvictionProgram:
    """Steps on one-block prompts, prompt p = [p] * block_size (distinct p: distinct blocks):
    ("use", p) allocate and free at once; ("hold", p) allocate and keep; ("free", i) free the i-th held sequence
    (in allocation order); ("lookup", p).  At most num_blocks - 1 sequences are held, so every allocate fits."""
    num_blocks: int
    block_size: int
    steps: tuple[tuple[str, int], ...]

    @property
    def num_prompts(self) -> int:
        return self.num_blocks + 3  # a few more prompts than blocks: something is evicted


@st.composite
def eviction_programs(draw: st.DrawFn) -> EvictionProgram:
    num_blocks, block_size = draw(st.integers(2, 4)), draw(st.integers(1, 3))
    prompt_ids = st.integers(0, num_blocks + 2)  # EvictionProgram.num_prompts of them
    steps, held = [], 0
    for _ in range(draw(st.integers(1, 24))):
        kinds = ["use", "lookup"] + (["hold"] if held < num_blocks - 1 else []) + (["free"] if held else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "free":
            steps.append((kind, draw(st.integers(0, held - 1))))
        else:
            steps.append((kind, draw(prompt_ids)))
        held += {"hold": 1, "free": -1}.get(kind, 0)
    return EvictionProgram(num_blocks, block_size, tuple(steps))


# ---------------------------------------------------------------------------------------------
# quantization
QUANT_GROUP_SIZES = (1, 2, 3, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class QuantCase:
    """A (rows, cols) weight of standard-normal entries, row r scaled by 10^u_r with u_r ~ U(-spread, spread)
    (so rows, and groups, have very different ranges); ``zero_rows`` leading rows and, when
    ``zero_group`` is set, the first group of every other row are exactly zero."""

    rows: int
    cols: int
    bits: int
    granularity: str
    group_size: int | None
    dtype: str
    seed: int
    spread: float = 0.0
    zero_rows: int = 0
    zero_group: bool = False
    device: str = "cpu"

    def tensor(self) -> torch.Tensor:
        g = generator(self.seed)
        w = torch.randn(self.rows, self.cols, generator=g, dtype=torch.float64)
        u = (2 * torch.rand(self.rows, 1, generator=g, dtype=torch.float64) - 1) * self.spread  # (rows, 1)
        w = w * 10.0**u
        w[: self.zero_rows] = 0.0
        if self.zero_group:
            w[1::2, : self.group_size or self.cols] = 0.0
        return w.to(dtype_of(self.dtype)).to(self.device)


@st.composite
def quant_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
                granularity: str | None = None, zeros: bool = False) -> QuantCase:
    group_size = draw(st.sampled_from(QUANT_GROUP_SIZES))
    cols = group_size * draw(st.integers(1, max(1, 256 // group_size)))  # group_size divides cols
    rows = draw(st.one_of(st.integers(1, 16), st.integers(17, 48)))  # past a 16-row tile
    gran = granularity or draw(st.sampled_from(("tensor", "channel", "group")))
    return QuantCase(
        rows=rows, cols=cols, bits=draw(st.integers(2, 8)), granularity=gran,
        group_size=group_size if gran == "group" else None, dtype=draw(st.sampled_from(dtypes)), seed=draw(seeds),
        spread=draw(st.sampled_from([0.0, 1.0, 3.0])),
        zero_rows=draw(st.integers(0, rows)) if zeros else 0, zero_group=draw(st.booleans()) if zeros else False,
        device=draw(st.sampled_from(devices)),
    )


@dataclass(frozen=True)
class LinearCase:
    """x (n, in) standard normal, with ``outliers`` input columns holding +-U(10, 100) (above LLM.int8()'s
    threshold of 6) in some of their rows, at least one (an outlier column need not be outliers all the
    way down), and the first ``zero_tokens`` rows all zero; w (out, in) standard normal / sqrt(in).
    ``calib``: also build 16 calibration activations, whose outlier columns are ``calib_outliers`` (None:
    the same as x's; a scheme that detects outliers at run time must not take them from calib).
    ``lead``: x's leading dims, (n,) or e.g. (2, n // 2): the contract's x is (..., in)."""

    n: int
    d_in: int
    d_out: int
    bits: int
    dtype: str
    seed: int
    outliers: tuple[int, ...] = ()
    zero_tokens: int = 0
    calib: bool = False
    device: str = "cpu"
    calib_outliers: tuple[int, ...] | None = None
    lead: tuple[int, ...] | None = None
    on_threshold: bool = False  # the last token holds -6.0, exactly LLM.int8()'s threshold, in a plain column
    outlier_rate: float = 0.7  # the chance a row of an outlier column is an outlier (0: one row only)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        g = generator(self.seed)
        x = self.activations(g, self.n, self.outliers)
        x[: self.zero_tokens] = 0.0
        plain = [j for j in range(self.d_in) if j not in self.outliers]
        if self.on_threshold and plain and self.zero_tokens < self.n:  # |x| > threshold makes an outlier; = does not
            x[-1, plain[0]] = -6.0
        w = torch.randn(self.d_out, self.d_in, generator=g, dtype=torch.float64) / self.d_in**0.5
        calib = self.activations(g, 16, self.outliers if self.calib_outliers is None else self.calib_outliers) \
            if self.calib else None
        x = x.reshape(*((self.n,) if self.lead is None else self.lead), self.d_in)  # (..., in); () for one token
        return tuple(None if t is None else t.to(dtype_of(self.dtype)).to(self.device) for t in (x, w, calib))

    def activations(self, g: torch.Generator, n: int, outliers: tuple[int, ...]) -> torch.Tensor:
        x = torch.randn(n, self.d_in, generator=g, dtype=torch.float64)
        for j in outliers:
            size = 10 + 90 * torch.rand(n, generator=g, dtype=torch.float64)  # (n,)
            hit = torch.rand(n, generator=g) < self.outlier_rate  # (n,): the rows where column j is an outlier
            hit[torch.randint(n, (1,), generator=g)] = True
            x[:, j] = torch.where(hit, torch.where(torch.rand(n, generator=g) < 0.5, -size, size), x[:, j])
        return x


@st.composite
def linear_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
                 multiple_of: int = 1, zero_tokens: bool = False, min_outliers: int = 0,
                 plain_columns: int = 0, leading_dims: bool = False) -> LinearCase:
    """At least min_outliers outlier columns (at most 3), and at least plain_columns that are not.
    ``leading_dims``: x may be 1-D (one token) or 3-D (batch, tokens, in) instead of (n, in)."""
    least = max(2, min_outliers + plain_columns)
    d_in = multiple_of * draw(st.integers(max(1, -(-least // multiple_of)), max(1, 128 // multiple_of)))
    n = draw(st.one_of(st.integers(1, 24), st.integers(25, 64)))  # past a 32-token tile too
    outliers = draw(st.sets(st.integers(0, d_in - 1), min_size=min_outliers, max_size=min(3, d_in - plain_columns)))
    calib_outliers = draw(st.one_of(st.none(), st.sets(st.integers(0, d_in - 1), max_size=3).map(sorted).map(tuple)))
    lead = draw(st.sampled_from([(n,), (1, n)] + [(a, n // a) for a in (2, 3, 4) if n % a == 0]
                                + ([()] if n == 1 else []))) if leading_dims else None
    return LinearCase(
        n=n, d_in=d_in, d_out=draw(st.integers(1, 32)), bits=draw(st.integers(2, 8)),
        dtype=draw(st.sampled_from(dtypes)), seed=draw(seeds), outliers=tuple(sorted(outliers)),
        zero_tokens=draw(st.integers(1, n)) if zero_tokens else 0, calib=draw(st.booleans()),
        device=draw(st.sampled_from(devices)), calib_outliers=calib_outliers, lead=lead,
        on_threshold=draw(st.booleans()), outlier_rate=draw(st.sampled_from([0.7, 0.0])),
    )


@st.composite
def outlier_batch_pairs(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
                        multiple_of: int = 1) -> tuple[LinearCase, LinearCase]:
    """Two batches of the same shapes whose outlier columns are different, non-empty sets; x may be 1-D or 3-D
    (outlier columns are found over the whole batch, every sequence of it)."""
    first = draw(linear_cases(dtypes=dtypes, devices=devices, multiple_of=multiple_of, min_outliers=1,
                              plain_columns=1, leading_dims=True))  # a column left for the second batch's outliers
    others = [j for j in range(first.d_in) if j not in first.outliers]
    second = draw(st.sets(st.sampled_from(others), min_size=1, max_size=min(3, len(others))))
    return first, LinearCase(**{**first.__dict__, "seed": draw(seeds), "outliers": tuple(sorted(second))})


@st.composite
def smoothing_cases(draw: st.DrawFn, min_alpha: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Float64 activations (n, in): standard normal, with 1-3 outlier channels of entries +-U(100, 1000)
    (so the channel-range ratio exceeds 100 / 6); a weight (out, in) of entries +-U(0.5, 1) (column
    ranges within 2x of each other); a migration strength in [min_alpha, 1]."""
    n, d_in, d_out = draw(st.integers(1, 16)), draw(st.integers(2, 64)), draw(st.integers(1, 32))
    g = generator(draw(seeds))
    x = torch.randn(n, d_in, generator=g, dtype=torch.float64)
    for j in draw(st.sets(st.integers(0, d_in - 1), min_size=1, max_size=min(3, d_in - 1))):
        size = 100 + 900 * torch.rand(n, generator=g, dtype=torch.float64)  # (n,)
        x[:, j] = torch.where(torch.rand(n, generator=g) < 0.5, -size, size)
    sign = torch.where(torch.rand(d_out, d_in, generator=g) < 0.5, -1.0, 1.0).double()
    w = sign * (0.5 + 0.5 * torch.rand(d_out, d_in, generator=g, dtype=torch.float64))
    return x, w, draw(st.floats(min_alpha, 1.0))


# ---------------------------------------------------------------------------------------------
# iomodel (harness/iomodel.py): one head's sizes and block sizes, values from a seed
@dataclass(frozen=True)
class IOCase:
    Nq: int
    Nk: int
    d: int
    Br: int
    Bc: int
    seed: int

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = generator(self.seed)
        return tuple(torch.randn(n, self.d, generator=g, dtype=torch.float64) for n in (self.Nq, self.Nk, self.Nk))


@st.composite
def io_cases(draw: st.DrawFn, square: bool = False, max_len: int = 96) -> IOCase:
    Nk = draw(st.integers(1, max_len))
    return IOCase(Nq=Nk if square else draw(st.integers(1, max_len)), Nk=Nk, d=draw(st.integers(1, 32)),
                  Br=draw(st.integers(1, 40)), Bc=draw(st.integers(1, 40)), seed=draw(seeds))


@st.composite
def sram_capacities(draw: st.DrawFn, d: int) -> int:
    """An SRAM size M (elements) that holds at least 1-row blocks of head dim d (4d + 7), up to 64 d^2."""
    return draw(st.integers(4 * d + 7, max(4 * d + 7, 64 * d * d)))


# ---------------------------------------------------------------------------------------------
# speculative decoding (harness/contracts/speculative.py): small exact models from a drawn seed
def probability_table(V: int, order: int, zeros: float, g: torch.Generator) -> torch.Tensor:
    """(V+1,)*order + (V,) float64 rows with arbitrary values, a share `zeros` of them exactly 0 (never a
    whole row), each row summing to one."""
    shape = (*(V + 1,) * order, V)
    t = torch.rand(shape, generator=g, dtype=torch.float64) ** 3  # skewed: tiny and large probabilities
    t[torch.rand(shape, generator=g, dtype=torch.float64) < zeros] = 0.0
    keep = torch.randint(V, (*shape[:-1], 1), generator=g)  # one entry per row stays positive
    t.scatter_(-1, keep, t.gather(-1, keep) + 0.05)
    return t / t.sum(-1, keepdim=True)


@dataclass(frozen=True)
class SpeculativeCase:
    V: int
    target_order: int
    draft: str  # "table", "target" (the draft is the target), "uniform", or "point" (one-hot rows)
    draft_order: int
    zeros: float  # share of table entries that are exactly zero
    gamma: int
    T: int
    prompt: tuple[int, ...]
    eos: int | None
    seed: int

    def models(self):
        from harness.lm import TableLM

        g = generator(self.seed)
        target = TableLM(probability_table(self.V, self.target_order, self.zeros, g))
        if self.draft == "target":
            return target, target
        table = probability_table(self.V, self.draft_order, self.zeros, g)
        if self.draft == "uniform":
            table = torch.full_like(table, 1.0 / self.V)
        elif self.draft == "point":
            table = torch.nn.functional.one_hot(table.argmax(-1), self.V).double()
        return target, TableLM(table)


@st.composite
def speculative_cases(draw: st.DrawFn, max_gamma: int = 4, max_T: int = 4, width: int = 1,
                      max_V: int = 6) -> SpeculativeCase:
    """`width` draft chains per round (multi-draft samplers): gamma is capped so that the V^(width gamma) draft
    trees of a round stay <= 256 and one enumeration stays under a second.  Targets of order 3 (V <= 4) see
    further back than a verify window of gamma + 1 = 2 tokens."""
    V = draw(st.integers(2, max_V))
    T = draw(st.integers(1, min(max_T, 3 if V > 4 else 4)))  # at most 6^3 output sequences: enumeration < 1 s
    if width > 1:
        max_gamma = max(1, min(max_gamma, int(math.log(256) / (width * math.log(V)))))
    return SpeculativeCase(
        V=V, target_order=draw(st.integers(0, 3 if V <= 4 else 2)),
        draft=draw(st.sampled_from(["table", "target", "uniform", "point"])),
        draft_order=draw(st.integers(0, 2)), zeros=draw(st.sampled_from([0.0, 0.3, 0.6])),
        gamma=draw(st.integers(1, max_gamma)), T=T,
        prompt=tuple(draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=3))),
        eos=draw(st.one_of(st.none(), st.integers(0, V - 1))), seed=draw(seeds),
    )


@dataclass(frozen=True)
class ContextFreePair:
    """Context-free target p and draft q (order-0 tables): acceptance a = sum(min(p, q)) every round."""

    V: int
    zeros: float
    gamma: int
    seed: int

    def models(self):
        from harness.lm import TableLM

        g = generator(self.seed)
        p, q = (probability_table(self.V, 0, self.zeros, g) for _ in range(2))
        return TableLM(p), TableLM(q)


@st.composite
def context_free_pairs(draw: st.DrawFn) -> ContextFreePair:
    gamma = draw(st.integers(1, 4))
    V = draw(st.integers(2, {1: 6, 2: 6, 3: 5, 4: 4}[gamma]))  # at most 5^3 draft sequences per round
    return ContextFreePair(V=V, zeros=draw(st.sampled_from([0.0, 0.3])), gamma=gamma, seed=draw(seeds))


# ---------------------------------------------------------------------------------------------
# checkpointing (impls/checkpointing/tanh_stack.py)
@dataclass(frozen=True)
class TanhStackCase:
    L: int  # layers
    k: int  # layers per checkpointed segment, 1..L
    batch: int
    width: int
    dtype: str
    seed: int

    def tensors(self) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """(h0, weights, dh_out); weights scaled by 1/sqrt(width) so tanh neither saturates nor vanishes."""
        g, dt = generator(self.seed), dtype_of(self.dtype)
        h0 = torch.randn(self.batch, self.width, generator=g, dtype=torch.float64)
        weights = [torch.randn(self.width, self.width, generator=g, dtype=torch.float64) / self.width ** 0.5
                   for _ in range(self.L)]
        dh_out = torch.randn(self.batch, self.width, generator=g, dtype=torch.float64)
        return h0.to(dt), [w.to(dt) for w in weights], dh_out.to(dt)


@st.composite
def tanh_stack_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64", "float32"), max_layers: int = 32
                     ) -> TanhStackCase:
    L = draw(st.integers(1, max_layers))
    return TanhStackCase(L=L, k=draw(st.integers(1, L)), batch=draw(st.integers(1, 4)),
                         width=draw(st.integers(1, 16)), dtype=draw(st.sampled_from(dtypes)), seed=draw(seeds))


# ---------------------------------------------------------------------------------------------
# kvcache (harness/contracts/kvcache.py): tiny random GPTs and ragged prompts, all from a drawn seed
POSITIONS = 32  # the block_size of every decode case's model: the most tokens a sequence may hold


@dataclass(frozen=True)
class DecodeCase:
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    positions: str  # "rotary" | "learned"
    vocab: int
    prompts: tuple[tuple[int, ...], ...]  # B prompts, ragged
    steps: tuple[tuple[int, ...], ...]  # decode steps, each B tokens
    max_len: int
    dtype: str
    seed: int

    def config(self, n_kv_head: int | None = None):
        from harness.models.gpt import GPTConfig

        return GPTConfig(vocab_size=self.vocab, block_size=POSITIONS, n_layer=self.n_layer, n_head=self.n_head,
                         n_kv_head=n_kv_head or self.n_kv_head, n_embd=self.n_head * self.head_dim,
                         positions=self.positions)

    def model(self):
        """A GPT with weights drawn from the seed (independent of torch's global RNG), in self.dtype."""
        from harness.models.gpt import GPT

        model, g = GPT(self.config()).double().eval(), generator(self.seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
                if name.endswith("weight") and p.dim() == 2 and not name.startswith(("wte", "wpe")):
                    p.copy_(noise / p.shape[1] ** 0.5)  # fan-in scaled: activations stay O(1)
                elif "ln" in name and name.endswith("weight"):
                    p.copy_(1 + 0.1 * noise)
                else:
                    p.copy_(noise if name.startswith(("wte", "wpe")) else 0.1 * noise)
        return model.to(dtype_of(self.dtype))

    def prompt_tensors(self) -> list[torch.Tensor]:
        return [torch.tensor(p, dtype=torch.long) for p in self.prompts]

    def step_tensors(self) -> list[torch.Tensor]:
        return [torch.tensor(s, dtype=torch.long) for s in self.steps]

    def sequences(self) -> list[torch.Tensor]:
        """Each row's whole token sequence: its prompt, then its stepped tokens."""
        return [torch.tensor([*p, *(s[b] for s in self.steps)], dtype=torch.long) for b, p in enumerate(self.prompts)]


@st.composite
def relate(draw: st.DrawFn, base: tuple[int, ...], rows: tuple[tuple[int, ...], ...],
           vocab: int) -> tuple[tuple[int, ...], ...]:
    """rows, each starting with base's tokens as far as both go; half the time one token in the first quarter
    of each differs from base's: the same later blocks after another prefix."""
    rows = tuple([*base[:len(row)], *row[len(base):]] for row in rows)
    if draw(st.booleans()):
        for row in rows:
            at = draw(st.integers(0, (len(row) - 1) // 4))
            row[at] = (row[at] + 1) % vocab
    return tuple(map(tuple, rows))


@st.composite
def decode_cases(
    draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), batch: tuple[int, int] = (1, 3), ragged: bool = True,
    max_prompt: int = 6, max_steps: int = 4, gqa: bool = False, spare: st.SearchStrategy[int] | None = None,
    fill: bool = False, related: bool = False,
) -> DecodeCase:
    """``gqa``: at least 2 kv heads shared by groups of at least 2 query heads (where a head mapping shows;
    a group of 3 catches a mapping that assumes a power of two).  ``fill``: half the time the longest row
    steps until it holds the model's 32 positions (a leftover sliding window drops the oldest).
    ``related``: half the time every row starts with row 0's tokens, one of them changed in half of those
    (a prefix cache keyed by a block's own tokens, not by everything before them, mixes them up).

    Never n_embd = 2: a LayerNorm over two features maps them to about +-1 whatever they are, and where the
    two nearly agree it amplifies the rounding of their difference, so the order a cache computes in (one
    row at a time) and the full forward's differ by more than the plain orders earn (a float64 case found by
    the thorough profile: 1.3e-14 against a bound of 6e-15 for every correct cache; recompute passed)."""
    n_kv_head = draw(st.integers(2, 3) if gqa else st.integers(1, 2))
    n_head = n_kv_head * draw(st.sampled_from([2, 3] if gqa else [1, 2, 3]))
    vocab, B = draw(st.integers(3, 17)), draw(st.integers(*batch))
    tokens = st.integers(0, vocab - 1)
    if ragged:
        lengths = [draw(st.integers(1, max_prompt)) for _ in range(B)]
    else:
        lengths = [draw(st.integers(1, max_prompt))] * B
    prompts = [tuple(draw(st.lists(tokens, min_size=n, max_size=n))) for n in lengths]
    if related and B > 1 and draw(st.booleans()):
        prompts = [prompts[0], *draw(relate(prompts[0], tuple(prompts[1:]), vocab))]
    room = POSITIONS - max(lengths)
    steps = [st.integers(0, min(max_steps, room))] + ([st.just(room)] if fill else [])
    n_steps = draw(st.one_of(*steps))
    spare_slots = draw(spare if spare is not None else st.integers(0, 3))
    return DecodeCase(
        n_layer=draw(st.integers(1, 3)), n_head=n_head, n_kv_head=n_kv_head,
        head_dim=draw(st.sampled_from([2, 4, 8] if n_head > 1 else [4, 8])),  # n_embd >= 4, see below
        positions=draw(st.sampled_from(["rotary", "learned"])), vocab=vocab, prompts=tuple(prompts),
        steps=tuple(tuple(draw(st.lists(tokens, min_size=B, max_size=B))) for _ in range(n_steps)),
        max_len=min(POSITIONS, max(lengths) + n_steps + spare_slots), dtype=draw(st.sampled_from(dtypes)),
        seed=draw(seeds),
    )


# ---------------------------------------------------------------------------------------------
# paged_attention
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
    strided: bool = False  # q, caches and tables are views into larger tensors, as a serving engine passes them
    offset: float = 0.0  # subtracted from every logit through one extra head dim (q: -offset/scale, k: 1, v: 0)

    def shared(self) -> int:
        """How many leading blocks are shared: no more than the longest sequence has."""
        return min(self.shared_blocks, max(-(-n // self.block_size) for n in self.seq_lens))

    def contiguous(self) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """q (B, H, Nq, d) and, per sequence, its contiguous k, v of shape (1, Hkv, seq_len, d): the first
        shared() * block_size keys of every sequence are one common prefix (d + 1 dims with an offset)."""
        g = generator(self.seed)
        q = torch.randn(self.B, self.H, self.Nq, self.d, generator=g, dtype=torch.float64) * self.magnitude
        prefix = torch.randn(2, 1, self.Hkv, self.shared() * self.block_size, self.d, generator=g, dtype=torch.float64)
        kv = [tuple(torch.cat([p[:, :, :n], torch.randn(1, self.Hkv, max(0, n - p.shape[2]), self.d, generator=g,
                                                         dtype=torch.float64)], dim=2) for p in prefix)
              for n in self.seq_lens]  # (1, Hkv, n, d) each
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
        bs, d, shared = self.block_size, q.shape[-1], self.shared()
        per_seq = [-(-n // bs) for n in self.seq_lens]
        own = [max(0, blocks - shared) for blocks in per_seq]
        num_blocks = shared + sum(own) + self.spare_blocks
        g = generator(self.seed ^ 0xB10C)
        physical = torch.randperm(num_blocks, generator=g).tolist()
        k_cache = torch.full((num_blocks, self.Hkv, bs, d), float("nan"), dtype=q.dtype, device=q.device)
        v_cache = k_cache.clone()
        max_blocks = max(per_seq) + self.table_slack  # padding entries must never be read
        tables = torch.randint(0, num_blocks, (self.B, max_blocks), generator=g)
        common, physical = physical[:shared], physical[shared:]
        longest = max(range(self.B), key=lambda b: self.seq_lens[b])  # its keys fill the shared blocks
        for b, (k, v) in enumerate(kv):
            ids = torch.tensor(common[:per_seq[b]] + physical[:own[b]])
            del physical[:own[b]]
            tables[b, :per_seq[b]] = ids
            for cache, t in ((k_cache, k), (v_cache, v)):
                padded = torch.full((self.Hkv, per_seq[b] * bs, d), float("nan"), dtype=q.dtype, device=q.device)
                padded[:, :self.seq_lens[b]] = t[0]  # (Hkv, blocks * bs, d), the tail of the last block NaN
                blocks = padded.reshape(self.Hkv, per_seq[b], bs, d).transpose(0, 1)  # (blocks, Hkv, bs, d)
                written = slice(0 if b == longest else min(shared, per_seq[b]), per_seq[b])  # shared: once
                cache[ids[written].to(q.device)] = blocks[written]
        index = getattr(torch, self.index_dtype)
        tables, seq_lens = tables.to(self.device, index), torch.tensor(self.seq_lens, dtype=index, device=self.device)
        return (*self.views(q, k_cache, v_cache, tables), seq_lens) if self.strided else \
            (q, k_cache, v_cache, tables, seq_lens)

    def views(self, q, k_cache, v_cache, tables) -> tuple[torch.Tensor, ...]:
        """The same values as views a serving engine passes: q sliced from a (B, Nq, H, d) projection, the
        caches the two halves of one (num_blocks, 2, Hkv, bs, d) pool, the tables the first columns of wider
        persistent ones."""
        q = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, Nq, d) view of (B, Nq, H, d) memory
        pool = torch.stack([k_cache, v_cache], dim=1)  # (num_blocks, 2, Hkv, bs, d)
        wide = torch.cat([tables, tables.flip(-1)], dim=-1)  # (B, 2 * max_blocks): valid ids past the view
        return q, pool[:, 0], pool[:, 1], wide[:, :tables.shape[1]]


@st.composite
def paged_attention_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
                          max_len: int = 200, decode: bool | None = None,
                          magnitude: st.SearchStrategy[float] | None = None, wide: bool = True,
                          offset: st.SearchStrategy[float] | None = None) -> PagedAttentionCase:
    """``wide``: real head groupings (head_counts), head dims 96-256 and blocks of 128 and 256 tokens as
    well (off for properties whose reference grows with H * Nq * Nk * d).  ``offset``: logits far below 0,
    with a nonzero scale (the offset is put in through it)."""
    H, Hkv = draw(head_counts(real_groups=wide))
    B = draw(st.integers(1, 3))
    seq_lens = tuple(draw(st.lists(lengths(max_len), min_size=B, max_size=B)))
    shortest = min(seq_lens)
    nq = st.just(1) if decode else st.one_of(st.just(1), st.integers(1, shortest), st.just(shortest))
    head_dims, block_sizes = [1, 8, 16, 64] + [96, 128, 256] * wide, [1, 2, 3, 8, 16, 32] + [128, 256] * wide
    return PagedAttentionCase(
        B=B, H=H, Hkv=Hkv, Nq=draw(nq if decode is not False else st.integers(1, shortest)), seq_lens=seq_lens,
        d=draw(st.one_of(st.sampled_from(head_dims), st.integers(1, 80))),
        block_size=draw(st.one_of(st.sampled_from(block_sizes), st.integers(1, 64))),
        spare_blocks=draw(st.integers(0, 3)), causal=draw(st.booleans()),
        scale=draw(scales if offset is None else nonzero_scales), dtype=draw(st.sampled_from(dtypes)),
        seed=draw(seeds), device=draw(st.sampled_from(devices)), index_dtype=draw(st.sampled_from(["int64", "int32"])),
        magnitude=draw(magnitude) if magnitude is not None else 1.0,
        table_slack=draw(st.integers(0, 2)), shared_blocks=draw(st.one_of(st.just(0), st.integers(1, 3))),
        strided=draw(st.booleans()), offset=draw(offset) if offset is not None else 0.0,
    )


@st.composite
def paged_attention_blind_row_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",),
                                    devices: tuple[str, ...] = ("cpu",)) -> PagedAttentionCase:
    """Causal chunks of Nq queries longer than the shortest sequence: its first Nq - seq_len rows see no key."""
    case = draw(paged_attention_cases(dtypes=dtypes, devices=devices, max_len=60, decode=False))
    return PagedAttentionCase(**{**vars(case), "Nq": min(case.seq_lens) + draw(st.integers(1, 8)), "causal": True})
