"""Attention cases (contract: harness/contracts/attention.py): shapes at tile edges, GQA groupings, scales, layouts."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from harness.strategies.common import generator, head_counts, lengths, scales, seeds
from harness.tolerance import dtype_of


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


EMPTY_SHAPES = {  # (q, k/v shape): an empty batch or head group, a prefill chunk of no tokens, no cache yet
    "B=0": ((0, 2, 4, 8), (0, 2, 4, 8)),
    "H=0": ((1, 0, 4, 8), (1, 1, 4, 8)),
    "Nq=0": ((1, 2, 0, 8), (1, 2, 4, 8)),
    "Nk=0": ((1, 2, 4, 8), (1, 2, 0, 8)),
}
BAD_CAUSAL = ("no", 0.5, None)  # causal values that must raise: a string, a float, None
