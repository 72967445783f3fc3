"""IO-model cases (harness/analytic/iomodel.py): one head's sizes and block sizes, values from a seed."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from llm_inference_harness.strategies.common import generator, seeds


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
