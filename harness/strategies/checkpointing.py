"""Activation-checkpointing cases (harness/analytic/checkpointing.py): the toy tanh stack."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from llm_inference_harness.engine.tolerance import dtype_of
from llm_inference_harness.strategies.common import generator, seeds


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
