"""Quantized-linear cases (contract: harness/contracts/quantized_linear.py): activations with outlier columns."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import event
from hypothesis import strategies as st

from llm_inference_harness.engine.tolerance import dtype_of
from llm_inference_harness.strategies.common import generator, seeds
from llm_inference_harness.strategies.quantization import LONG_ROWS


@dataclass(frozen=True)
class LinearCase:
    """x (n, in) standard normal, with ``outliers`` input columns holding +-U(10, 100) (above LLM.int8()'s
    threshold of 6) in some of their rows, at least one (an outlier column need not be outliers all the
    way down), and the first ``zero_tokens`` rows all zero; w (out, in) standard normal / sqrt(in), its first
    ``zero_channels`` rows all zero (pruned output channels: a scale of 0, the division every scheme must guard).
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
    zero_channels: int = 0
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
        w[: self.zero_channels] = 0.0
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


TOKENS = st.one_of(st.integers(1, 24), st.integers(25, 64))  # past a 32-token tile too; built once, not per draw


@st.composite
def linear_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
                 multiple_of: int = 1, zero_tokens: bool = False, min_outliers: int = 0,
                 plain_columns: int = 0, leading_dims: bool = False,
                 bits: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)) -> LinearCase:
    """At least min_outliers outlier columns (at most 3), and at least plain_columns that are not.
    ``leading_dims``: x may be 3-D (batch, tokens, in) instead of (n, in).  ``zero_tokens``: some leading tokens
    all zero, and some leading weight rows all zero (none, one, or every one)."""
    least = max(2, min_outliers + plain_columns)
    kind = draw(st.sampled_from(("plain",) * 7 + ("square", "square", "long")))
    if kind == "long":  # in-features past a 256..4096-element block: the reduction of every scale and of the sum
        lo, hi = draw(st.sampled_from(LONG_ROWS))
        d_in = multiple_of * draw(st.integers(-(-lo // multiple_of), max(-(-lo // multiple_of), hi // multiple_of)))
        n, d_out = draw(st.integers(1, 4)), draw(st.integers(1, 8))
        event(f"quantized_linear case: {d_in} in-features, past {lo - 1}")
    else:
        d_in = multiple_of * draw(st.integers(max(1, -(-least // multiple_of)), max(1, 128 // multiple_of)))
        n = draw(TOKENS)
        d_out = draw(st.integers(1, 32))
        if kind == "square":  # w (d, d), and x (d, d) when it fits: a kernel that sniffs (in, out) from the shape
            d_out = d_in
            n = d_in if d_in <= 64 else n
        event(f"quantized_linear case: {'square' if d_out == d_in else 'rectangular'} weight")
    outliers = draw(st.sets(st.integers(0, d_in - 1), min_size=min_outliers, max_size=min(3, d_in - plain_columns)))
    calib_outliers = draw(st.one_of(st.none(), st.sets(st.integers(0, d_in - 1), max_size=3).map(sorted).map(tuple)))
    lead = draw(st.sampled_from([(n,), (1, n)] + [(a, n // a) for a in (2, 3, 4) if n % a == 0])) \
        if leading_dims else None  # 1-d and 4-d x: every example of test_any_leading_dims
    return LinearCase(
        n=n, d_in=d_in, d_out=d_out, bits=draw(st.sampled_from(bits)),
        dtype=draw(st.sampled_from(dtypes)), seed=draw(seeds), outliers=tuple(sorted(outliers)),
        zero_tokens=draw(st.integers(1, n)) if zero_tokens else 0, calib=draw(st.booleans()),
        device=draw(st.sampled_from(devices)), calib_outliers=calib_outliers, lead=lead,
        on_threshold=draw(st.booleans()), outlier_rate=draw(st.sampled_from([0.7, 0.0])),
        zero_channels=draw(st.sampled_from([0, 1, d_out])) if zero_tokens else 0,
    )


@st.composite
def outlier_batch_pairs(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
                        multiple_of: int = 1, bits: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
                        ) -> tuple[LinearCase, LinearCase]:
    """Two batches of the same shapes whose outlier columns are different, non-empty sets; x may be 1-D or 3-D
    (outlier columns are found over the whole batch, every sequence of it)."""
    first = draw(linear_cases(dtypes=dtypes, devices=devices, multiple_of=multiple_of, min_outliers=1,
                              plain_columns=1, leading_dims=True, bits=bits))  # a column left for the second's outliers
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
