"""Sampling cases (contract: harness/contracts/sampling.py): a batch of logits from a drawn seed and per-row
parameters drawn from the values where bugs live -- each parameter's off value first, the edges (top_k 1 and
V, top_p near 0, min_p 1, temperature 0 beside sampled rows), penalties of both signs on prompt and output ids.

Logits come in two kinds: "grid" rows take values in steps of 1/2 in [-3, 3], so ties at the top-k and top-p
boundaries are common (exact in float32 and float64, and after the penalties and temperatures drawn here),
and "normal" rows are Gaussian at a drawn scale.  A share of tokens is -inf, never a whole row.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace

import torch
from hypothesis import strategies as st

from llm_inference_harness.contracts.sampling import OFF, PARAMS, SamplingParams, sampling_params
from llm_inference_harness.engine.tolerance import dtype_of
from llm_inference_harness.strategies.common import generator, seeds

TEMPERATURES = [1.0, 0.0, 0.5, 0.7, 1.5, 2.0, 0.25]
TOP_PS = [1.0, 0.9, 0.75, 0.5, 0.3, 0.1, 1e-3]
MIN_PS = [0.0, 0.05, 0.2, 0.5, 1.0]
REPETITION = [1.0, 1.25, 2.0, 0.8]
PRESENCE = [0.0, 0.5, -0.5, 1.0]
FREQUENCY = [0.0, 0.25, 0.5]
# A row batched with the row under test: peaked logits and every parameter at an extreme, so that a parameter, a
# history or a maximum that leaks from it changes the other row's distribution.
COMPANION = {"temperature": 0.25, "top_k": 1, "top_p": 0.1, "min_p": 0.5, "repetition_penalty": 2.0,
             "presence_penalty": 1.0, "frequency_penalty": 0.5}
COMPANION_ROW = -1
SHIFTS = [-1000.0, -37.5, 64.0, 1024.0]  # exact in float32 for grid logits: only the shift can change the answer
# The largest V per batch size for a sampler whose joint output distribution is enumerated: a rejection sampler
# takes up to 2^(V-1) branches a row, and a batch's branches multiply (<= 128 runs a case).
ENUMERABLE_VOCAB = {1: 8, 2: 4}


@dataclass(frozen=True)
class SamplingCase:
    V: int
    dtype: str
    kind: str  # "grid" or "normal"
    scale: float  # of "normal" logits
    masked: float  # share of -inf logits (never a whole row)
    seed: int
    params: SamplingParams
    shift: float = 0.0  # added to every finite logit
    row_ids: tuple[int, ...] = ()  # which drawn rows, in this order (empty: 0 .. B-1): each row's logits are its own
    # (COMPANION_ROW: a companion's)

    @property
    def B(self) -> int:
        return self.params.rows

    def logits(self) -> torch.Tensor:
        """(B, V) in the case's dtype; row r's values come from the seed and r alone."""
        rows = [self._row(r) for r in (self.row_ids or range(self.B))]
        dtype = dtype_of(self.dtype)
        return torch.stack(rows).to(dtype) if rows else torch.empty(0, self.V, dtype=dtype)

    def _row(self, r: int) -> torch.Tensor:
        if r == COMPANION_ROW:
            return torch.arange(self.V, 0, -1, dtype=torch.float64) * 2 + self.shift  # peaked at token 0
        g = generator((self.seed + 104729 * r) % 2**62)
        x = torch.randint(-6, 7, (self.V,), generator=g).double() / 2 if self.kind == "grid" else (
            torch.randn(self.V, generator=g, dtype=torch.float64) * self.scale)
        masked = torch.rand(self.V, generator=g) < self.masked
        masked[int(torch.randint(self.V, (), generator=g))] = False  # a finite logit in every row
        return (x + self.shift).masked_fill(masked, -torch.inf)

    def rows(self, ids) -> SamplingCase:
        """These rows of the case, in this order (one of them alone: ``rows([b])``)."""
        ids = list(ids)
        drawn = self.row_ids or tuple(range(self.B))
        return replace(self, params=self.params.select(ids), row_ids=tuple(drawn[b] for b in ids))


@st.composite
def row_params(draw: st.DrawFn, V: int, supported: tuple[str, ...]) -> dict:
    """One row's parameters and history; a parameter the implementation does not apply stays off."""
    choices = {
        "temperature": st.sampled_from(TEMPERATURES),
        "top_k": st.sampled_from([k for k in dict.fromkeys([0, 1, 2, 3, V - 1, V]) if k <= V]),
        "top_p": st.sampled_from(TOP_PS),
        "min_p": st.sampled_from(MIN_PS),
        "repetition_penalty": st.sampled_from(REPETITION),
        "presence_penalty": st.sampled_from(PRESENCE),
        "frequency_penalty": st.sampled_from(FREQUENCY),
    }
    row = {name: draw(choices[name]) if name in supported else OFF[name] for name in PARAMS}
    history = st.lists(st.integers(0, V - 1), max_size=4)
    penalties = {"repetition_penalty", "presence_penalty", "frequency_penalty"} & set(supported)
    row["prompt_tokens"] = tuple(draw(history)) if penalties else ()
    row["output_tokens"] = tuple(draw(history)) if penalties else ()
    return row


def params_of(rows: list[dict]) -> SamplingParams:
    return SamplingParams(**{name: tuple(r[name] for r in rows) for name in rows[0]})


@functools.cache
def _kinds() -> st.SearchStrategy:
    return st.sampled_from(["grid", "normal"])


@st.composite
def sampling_cases(draw: st.DrawFn, dtypes: tuple[str, ...], supported: tuple[str, ...] = PARAMS,
                   enumerable: bool = True, max_vocab: int = 0, max_batch: int = 2, greedy: bool = False,
                   shift: bool = False) -> SamplingCase:
    """A batch of 1 to ``max_batch`` rows.  ``enumerable``: one or two rows, small enough that a sampler's joint
    output distribution is enumerated in well under a second (ENUMERABLE_VOCAB); ``greedy``: every other row at
    temperature 0; ``shift``: every logit moved by one of SHIFTS."""
    B = draw(st.integers(1, min(max_batch, 2) if enumerable else max_batch))
    top = ENUMERABLE_VOCAB[B] if enumerable else 16
    V = draw(st.integers(2, min(top, max_vocab) if max_vocab else top))
    rows = [draw(row_params(V, supported)) for _ in range(B)]
    if greedy:
        rows = [{**r, "temperature": 0.0} if b % 2 == 0 else r for b, r in enumerate(rows)]
    return SamplingCase(
        V=V, dtype=draw(st.sampled_from(dtypes)), kind=draw(_kinds()), scale=draw(st.sampled_from([1.0, 3.0, 0.3])),
        masked=draw(st.sampled_from([0.0, 0.0, 0.25])), seed=draw(seeds), params=params_of(rows),
        shift=draw(st.sampled_from(SHIFTS)) if shift else 0.0,
    )


@st.composite
def companion_cases(draw: st.DrawFn, dtypes: tuple[str, ...], supported: tuple[str, ...] = PARAMS,
                    max_vocab: int = 0) -> SamplingCase:
    """A drawn row beside the COMPANION row, before or after it (two rows: V <= ENUMERABLE_VOCAB[2]); the drawn row
    samples at a drawn temperature with min-p, its other filters off, its penalties and history drawn."""
    case = draw(sampling_cases(dtypes, supported, max_vocab=min(max_vocab or 99, ENUMERABLE_VOCAB[2]),
                               max_batch=1))
    companion = {name: COMPANION[name] if name in supported else OFF[name] for name in PARAMS}
    companion |= {"prompt_tokens": tuple(range(case.V)), "output_tokens": (0, 0, 1)}
    row = {f: getattr(case.params, f)[0] for f in companion}
    # the drawn row samples with its filters off but min-p, so that any filter or maximum the companion leaks shows
    row |= {"temperature": draw(st.sampled_from([1.0, 0.5, 2.0])), "top_k": 0, "top_p": 1.0,
            "min_p": draw(st.sampled_from([0.1, 0.3, 0.6])) if "min_p" in supported else 0.0}
    rows = [row, companion]
    order = [0, 1] if draw(st.booleans()) else [1, 0]
    return replace(case, params=params_of([rows[i] for i in order]),
                   row_ids=tuple((0, COMPANION_ROW)[i] for i in order))


def without_repetition_penalty(case: SamplingCase) -> SamplingCase:
    """The case with the repetition penalty off: the one transform that is not invariant to a shift of the logits
    (it divides positive logits and multiplies negative ones)."""
    return replace(case, params=replace(case.params, repetition_penalty=(1.0,) * case.B))


# The whole parameter grid at V = 8: every combination of these values on one row of logits with ties at the
# top-k and top-p boundaries, a -inf token, and a history that meets positive and negative logits (-0.5 and -1:
# CTRL's penalty multiplies a negative logit, which moves one of magnitude below 1 the other way from a division).
GRID = {"temperature": (0.0, 0.5, 1.0, 2.0), "top_k": (0, 1, 3, 8), "top_p": (0.5, 0.9, 1.0), "min_p": (0.0, 0.2),
        "penalties": ({}, {"repetition_penalty": 1.5, "presence_penalty": 0.5, "frequency_penalty": 0.25})}
GRID_LOGITS = [1.0, 2.0, 2.0, -0.5, -1.0, -torch.inf, 2.0, 2.5]
GRID_HISTORY = {"prompt_tokens": (1, 3, 4), "output_tokens": (2, 2, 7, 4)}


def parameter_grid(supported: tuple[str, ...] = PARAMS) -> tuple[torch.Tensor, SamplingParams]:
    """(logits (N, 8) float64, params): every point of GRID, the parameters not in ``supported`` off."""
    points = {}
    for values in itertools.product(*GRID.values()):
        point = {**dict(zip(GRID, values[:-1], strict=False)), **values[-1]}
        point = {k: point.get(k, OFF[k]) if k in supported else OFF[k] for k in PARAMS}
        points[tuple(point.values())] = point  # a parameter it does not apply makes two points one
    N = len(points)
    params = sampling_params(N, **{k: [p[k] for p in points.values()] for k in PARAMS},
                             prompt_tokens=[GRID_HISTORY["prompt_tokens"]] * N,
                             output_tokens=[GRID_HISTORY["output_tokens"]] * N)
    return torch.tensor([GRID_LOGITS] * N, dtype=torch.float64), params


@st.composite
def processing_params(draw: st.DrawFn) -> SamplingParams:
    """One row of temperature, top-k, top-p and min-p for speculative decoding on processed distributions (penalties
    off).  The values keep clear of the masses of the drawn tables' rows, so that two correct processings decide
    every token alike (a uniform row's masses are multiples of 1/V, V <= 6)."""
    row = {"temperature": draw(st.sampled_from([1.0, 0.6, 1.7, 0.0])), "top_k": draw(st.sampled_from([0, 1, 2])),
           "top_p": draw(st.sampled_from([1.0, 0.83, 0.62])), "min_p": draw(st.sampled_from([0.0, 0.13]))}
    return params_of([{**OFF, **row, "prompt_tokens": (), "output_tokens": ()}])
