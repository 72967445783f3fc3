"""Hypothesis strategies, one typed module for every technique.

Strategies build valid inputs directly (no `assume`): shapes are drawn so that every constraint
of the contract already holds.  Tensor values come from a drawn seed, so a shrunk counterexample
prints as a small readable record that regenerates the exact tensors.
"""

from __future__ import annotations

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

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = generator(self.seed)
        q = torch.randn(self.B, self.H, self.Nq, self.d, generator=g, dtype=torch.float64) * self.magnitude
        k = torch.randn(self.B, self.Hkv, self.Nk, self.d, generator=g, dtype=torch.float64)
        v = torch.randn(self.B, self.Hkv, self.Nk, self.d, generator=g, dtype=torch.float64)
        return tuple(t.to(dtype_of(self.dtype)).to(self.device) for t in (q, k, v))


@st.composite
def attention_cases(
    draw: st.DrawFn,
    dtypes: tuple[str, ...] = ("float64",),
    devices: tuple[str, ...] = ("cpu",),
    max_len: int = 300,
    causal: bool | None = None,
    magnitude: st.SearchStrategy[float] | None = None,
) -> AttentionCase:
    Hkv = draw(st.integers(1, 4))
    H = Hkv * draw(st.sampled_from([g for g in (1, 2, 4) if Hkv * g <= 4]))  # Hkv divides H, H <= 4
    Nk = draw(lengths(max_len))
    Nq = draw(st.one_of(st.just(1), lengths(max_len), st.just(Nk)))  # decode, Nq != Nk, square
    d = draw(st.one_of(st.sampled_from([1, 3, 8, 16, 59, 64, 111, 128]), st.integers(1, 128)))
    return AttentionCase(
        B=draw(st.integers(1, 2)), H=H, Hkv=Hkv, Nq=Nq, Nk=Nk, d=d,
        causal=draw(st.booleans()) if causal is None else causal,
        scale=draw(st.one_of(st.none(), st.floats(0.01, 2.0))),
        dtype=draw(st.sampled_from(dtypes)), seed=draw(seeds),
        magnitude=draw(magnitude) if magnitude is not None else 1.0,
        device=draw(st.sampled_from(devices)),
    )


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
    do = torch.randn(case.B, case.H, case.Nq, case.d, generator=g, dtype=torch.float64)
    return do.to(dtype_of(case.dtype)).to(case.device)


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
    """Small pools, so that running out of blocks, eviction and reuse of evicted blocks all happen."""
    return st.builds(PoolGeometry, st.sampled_from([1, 2, 3, 4]), st.integers(0, 12), st.integers(0, 6))


def token_lists(block_size: int, min_size: int = 1) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, TOKEN_ALPHABET - 1), min_size=min_size, max_size=4 * block_size + 1)


@st.composite
def prompts(draw: st.DrawFn, history: list[list[int]], block_size: int) -> list[int]:
    """A prompt: fresh; an earlier prompt's prefix (cut mostly at a block boundary) plus new tokens; or an
    earlier prompt with one token of its first block changed -- equal later blocks under another prefix."""
    kind = draw(st.sampled_from(["fresh", "shared_prefix", "other_prefix"] if history else ["fresh"]))
    if kind == "fresh":
        return draw(token_lists(block_size))
    base = draw(st.sampled_from(list(history)))
    if kind == "shared_prefix":
        cut = draw(st.one_of(st.sampled_from(range(0, len(base) + 1, block_size)), st.integers(0, len(base))))
        return base[:cut] + draw(token_lists(block_size, min_size=0 if cut else 1))
    j = draw(st.integers(0, min(block_size, len(base)) - 1))
    return [*base[:j], (base[j] + 1) % TOKEN_ALPHABET, *base[j + 1:]]
