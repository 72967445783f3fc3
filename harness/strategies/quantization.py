"""Quantizer cases (contract: harness/contracts/quantization.py): weights whose rows and groups span decades."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import event
from hypothesis import strategies as st

from llm_inference_harness.contracts.quantization import GRANULARITIES, scale_shape
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
    ``zero_group`` is set, the first group of every other row are exactly zero.

    ``mirror``: every group (of the case's granularity, 2 elements or more, not all zero) has its max exactly
    minus its min, at a magnitude m = (2^b - 1) 2^k: "groups" sets one element of each group to +m and one to -m
    (m the smallest such magnitude >= the group's max|w|, the rest clamped into [-m, m]); "ternary" makes every
    weight -m_r, 0 or +m_r (BitNet b1.58's ternary weights, m_r per row) and then each group holds both +m and -m.
    With such an m, (max - min) / (2^b - 1) = 2^(k+1) exactly in every float dtype, so max / s = -min / s =
    (2^b - 1) / 2, a tie (so is -max|w| / s for the full convention's s = max|w| / (2^(b-1) - 1/2)): a zero point
    rounds it up to 2^(b-1) and the max's code round(max / s) + z is 2^b before the clamp to 2^b - 1.  Random
    normal weights never draw it."""

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
    mirror: str | None = None  # None, "groups" or "ternary": every group's max is exactly minus its min (a tie)

    def tensor(self) -> torch.Tensor:
        g = generator(self.seed)
        w = torch.randn(self.rows, self.cols, generator=g, dtype=torch.float64)
        u = (2 * torch.rand(self.rows, 1, generator=g, dtype=torch.float64) - 1) * self.spread  # (rows, 1)
        w = w * 10.0**u
        if self.mirror == "ternary":  # -m_r, 0 or +m_r, by the sign of the normal draw rounded at +-1/2
            w = torch.round(w / 10.0**u).clamp(-1, 1) * tie_magnitude(10.0**u, 2**self.bits - 1) + 0.0  # no -0.0
        if self.mirror is not None:
            w = mirrored(w, 2**self.bits - 1, self.granularity, self.group_size)
        w[: self.zero_rows] = 0.0
        if self.zero_group:
            w[1::2, : self.group_size or self.cols] = 0.0
        if self.peak_at is not None:
            w[:, self.peak_at] = 1.5 * w.abs().amax(dim=1) * torch.where(w[:, self.peak_at] < 0, -1.0, 1.0)
        return w.to(dtype_of(self.dtype)).to(self.device)


def tie_magnitude(a: torch.Tensor, levels: int) -> torch.Tensor:
    """The smallest levels * 2^k >= a (a > 0), exactly: its (levels * 2^k) / levels is the power of two 2^k."""
    mant, exp = torch.frexp(a / levels)  # a / levels = mant 2^exp, mant in [1/2, 1)
    return levels * 2.0 ** (exp - (mant == 0.5).to(exp.dtype)).to(a.dtype)


def mirrored(w: torch.Tensor, levels: int, granularity: str, group_size: int | None) -> torch.Tensor:
    """w with every group of 2 elements or more that is not all zero given max = m and min = -m exactly, m =
    tie_magnitude(its max|w|): its largest element (the first, at a tie) set to +m, its smallest (another one where
    every element is equal) to -m, the rest clamped into [-m, m]."""
    blocks = w.reshape(*scale_shape(w, granularity, group_size), -1)  # (R, G, n)
    n = blocks.shape[-1]
    a = blocks.abs().amax(dim=-1)  # (R, G)
    if n < 2 or not bool((a > 0).any()):
        return w
    m = torch.where(a > 0, tie_magnitude(a.clamp(min=torch.finfo(a.dtype).tiny), levels), 0.0)[..., None]
    out = torch.minimum(torch.maximum(blocks, -m), m)  # (R, G, n)
    top, bottom = out.argmax(dim=-1, keepdim=True), out.argmin(dim=-1, keepdim=True)  # (R, G, 1)
    bottom = torch.where(bottom == top, (top + 1) % n, bottom)
    out = out.scatter(-1, top, m).scatter(-1, bottom, -m)
    return torch.where(a[..., None] > 0, out, blocks).reshape(w.shape)


ROWS = st.one_of(st.integers(1, 16), st.integers(17, 48))  # built once: a new strategy per draw is validated anew
MIRRORS = st.sampled_from((None,) * 6 + ("groups", "ternary"))  # one case in four: exact ties (QuantCase.mirror)


@st.composite
def quant_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
                granularity: str | None = None, zeros: bool = False, caps=None) -> QuantCase:
    """A case inside the formats ``caps`` (QuantizationCaps) declares: its bit widths, granularities and group
    sizes.  Shapes on purpose: square (rows = cols, where a kernel that sniffs its layout from the shape takes
    w as (in, out)) for one case in five, a row past a 256..4096-element block for one in ten.  Values on purpose:
    for one case in four every group's max is exactly minus its min (``QuantCase.mirror``: mirrored groups or
    ternary weights), where a zero point and the max's code land on rounding ties."""
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
    mirror = draw(MIRRORS)
    if mirror is not None:
        event(f"quantization case: {mirror} with max = -min in every group")
    return QuantCase(
        rows=rows, cols=cols, bits=bits, granularity=gran,
        group_size=group_size if gran == "group" else None, dtype=draw(st.sampled_from(dtypes)), seed=draw(seeds),
        spread=draw(st.sampled_from([0.0, 1.0, 3.0])),
        zero_rows=draw(st.integers(0, rows)) if zeros else 0, zero_group=draw(st.booleans()) if zeros else False,
        device=draw(st.sampled_from(devices)), mirror=mirror,
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
