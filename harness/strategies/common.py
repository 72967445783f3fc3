"""Strategy building blocks shared by every technique: seeds, lengths at tile edges, head groupings, scales."""

from __future__ import annotations

import functools

import torch
from hypothesis import strategies as st

seeds = st.integers(min_value=0, max_value=2**31 - 1)
# Tile edges of the block sizes we register, +-1: where partial-tile and diagonal bugs live.
TILE_EDGES = sorted({n for b in (16, 17, 24, 32, 33, 40, 48, 64, 80, 128, 256) for n in (b - 1, b, b + 1)})


@functools.cache  # one strategy per bound: a new one per draw is validated again (a third of a shape's draw)
def lengths(max_len: int = 300) -> st.SearchStrategy[int]:
    edges = [n for n in TILE_EDGES if 1 <= n <= max_len]
    return st.one_of(st.sampled_from([1, 2, *edges]), st.integers(1, max_len))


@functools.cache
def head_counts(real_groups: bool = False) -> st.SearchStrategy[tuple[int, int]]:
    return _head_counts(real_groups)


@st.composite
def _head_counts(draw: st.DrawFn, real_groups: bool = False) -> tuple[int, int]:
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
