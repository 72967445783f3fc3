"""Quantizer cases (contract: harness/contracts/quantization.py): weights whose rows and groups span decades."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from harness.strategies.common import generator, seeds
from harness.tolerance import dtype_of

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
