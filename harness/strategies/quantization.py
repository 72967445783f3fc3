"""Quantizer cases (contract: harness/contracts/quantization.py): weights whose rows and groups span decades."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import event
from hypothesis import strategies as st

from llm_inference_harness.contracts.quantization import GRANULARITIES
from llm_inference_harness.engine.tolerance import dtype_of
from llm_inference_harness.strategies.common import generator, seeds

QUANT_GROUP_SIZES = (1, 2, 3, 4, 8, 16, 32, 64, 128)
# Reductions longer than one 256-, 512-, 1024- or 4096-element block: a kernel that reduces only its first
# block of a row passes every shorter row.  Drawn for one case in ten, with 1-3 rows to keep them cheap.
LONG_ROWS = ((257, 512), (513, 1024), (1025, 2048), (4097, 4400))


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
    peak_at: int | None = None  # this column holds every row's largest magnitude (1.5x the row's absmax)

    def tensor(self) -> torch.Tensor:
        g = generator(self.seed)
        w = torch.randn(self.rows, self.cols, generator=g, dtype=torch.float64)
        u = (2 * torch.rand(self.rows, 1, generator=g, dtype=torch.float64) - 1) * self.spread  # (rows, 1)
        w = w * 10.0**u
        w[: self.zero_rows] = 0.0
        if self.zero_group:
            w[1::2, : self.group_size or self.cols] = 0.0
        if self.peak_at is not None:
            w[:, self.peak_at] = 1.5 * w.abs().amax(dim=1) * torch.where(w[:, self.peak_at] < 0, -1.0, 1.0)
        return w.to(dtype_of(self.dtype)).to(self.device)


ROWS = st.one_of(st.integers(1, 16), st.integers(17, 48))  # built once: a new strategy per draw is validated anew


@st.composite
def quant_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
                granularity: str | None = None, zeros: bool = False, caps=None) -> QuantCase:
    """A case inside the formats ``caps`` (QuantizationCaps) declares: its bit widths, granularities and group
    sizes.  Shapes on purpose: square (rows = cols, where a kernel that sniffs its layout from the shape takes
    w as (in, out)) for one case in five, a row past a 256..4096-element block for one in ten."""
    sizes = QUANT_GROUP_SIZES if caps is None or caps.group_sizes is None else caps.group_sizes
    sizes = tuple(g for g in sizes if caps is None or g not in caps.excluded_group_sizes)
    group_size = draw(st.sampled_from(sizes))
    kind = draw(st.sampled_from(("plain",) * 7 + ("square", "square", "long")))
    if kind == "long":
        lo, hi = draw(st.sampled_from(LONG_ROWS))
        cols = group_size * draw(st.integers(-(-lo // group_size), max(-(-lo // group_size), hi // group_size)))
        rows = draw(st.integers(1, 3))
        event(f"quantization case: a row of {cols} elements, past {lo - 1}")
    else:
        cols = group_size * draw(st.integers(1, max(1, 256 // group_size)))  # group_size divides cols
        rows = cols if kind == "square" and cols <= 128 else draw(ROWS)
        event(f"quantization case: {'square' if rows == cols else 'rectangular'} weight")
    grans = GRANULARITIES if caps is None else caps.granularities
    gran = granularity or draw(st.sampled_from(grans))
    bits = draw(st.sampled_from(tuple(range(2, 9)) if caps is None else caps.bits))
    return QuantCase(
        rows=rows, cols=cols, bits=bits, granularity=gran,
        group_size=group_size if gran == "group" else None, dtype=draw(st.sampled_from(dtypes)), seed=draw(seeds),
        spread=draw(st.sampled_from([0.0, 1.0, 3.0])),
        zero_rows=draw(st.integers(0, rows)) if zeros else 0, zero_group=draw(st.booleans()) if zeros else False,
        device=draw(st.sampled_from(devices)),
    )


@st.composite
def long_row_cases(draw: st.DrawFn, lo: int, hi: int, dtypes: tuple[str, ...] = ("float64",),
                   devices: tuple[str, ...] = ("cpu",), caps=None) -> QuantCase:
    """1-2 rows of lo..hi elements whose largest magnitude sits past the first lo - 1 (a reduction that sees only
    its first block of a row misses it), inside the declared formats."""
    base = draw(quant_cases(dtypes=dtypes, devices=devices, caps=caps))
    g = base.group_size or 1
    cols = g * draw(st.integers(-(-lo // g), max(-(-lo // g), hi // g)))
    return QuantCase(**{**base.__dict__, "rows": draw(st.integers(1, 2)), "cols": cols, "zero_rows": 0,
                        "peak_at": draw(st.integers(lo - 1, cols - 1))})
