"""Batch compositions for the batch-invariance properties (harness/engine/batch_invariance.py): a row of a technique's
own case, the other rows it is batched with, where it sits, a permutation, query chunks, a serving schedule.

Each composition is a frozen dataclass built from the technique's case (harness/strategies/<technique>.py),
so the properties draw them and the measurement (`llm_inference_harness.engine.batch_invariance.measure`) builds a
fixed list of them from seeds, and both compute the same comparisons.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from llm_inference_harness.strategies.attention import ARGUMENTS, AttentionCase, attention_cases
from llm_inference_harness.strategies.common import generator, seeds
from llm_inference_harness.strategies.kvcache import DecodeCase, decode_cases
from llm_inference_harness.strategies.paged_attention import PagedAttentionCase, paged_attention_cases
from llm_inference_harness.strategies.quantized_linear import LinearCase, linear_cases
from llm_inference_harness.strategies.speculative import SpeculativeCase, speculative_cases

MAGNITUDES = (1e-2, 1.0, 30.0)  # other rows' scale: a kernel with a batch-wide max or scale shows it


def precise(dtypes: tuple[str, ...]) -> st.SearchStrategy[str]:
    """A dtype among ``dtypes``, float32 or float64 three times in four where declared: a reduction order shows
    in every bit of those, while rounding a float32 accumulator to bfloat16 hides most of it."""
    high = [d for d in dtypes if d in ("float32", "float64")]
    return st.one_of(st.sampled_from(high), st.sampled_from(high), st.sampled_from(high),
                     st.sampled_from(dtypes)) if high else st.sampled_from(dtypes)


def permutation(n: int, seed: int) -> list[int]:
    """A permutation of range(n) from the seed: new row i is old row perm[i]."""
    return torch.randperm(n, generator=generator(seed)).tolist()


@st.composite
def cuts(draw: st.DrawFn, n: int) -> tuple[int, ...]:
    """Sorted chunk boundaries strictly inside (0, n): 0 to 3 of them, or every row its own chunk (n = 1
    decode steps, as a serving engine computes a prompt token by token)."""
    if n > 1 and draw(st.integers(0, 4)) == 0:
        return tuple(range(1, n))
    return tuple(sorted(draw(st.sets(st.integers(1, n - 1), max_size=3)))) if n > 1 else ()


def chunks(n: int, boundaries: tuple[int, ...]) -> list[tuple[int, int]]:
    """[(a, b)] covering 0..n at the boundaries."""
    edges = [0, *boundaries, n]
    return list(zip(edges[:-1], edges[1:], strict=True))


# --- attention -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionBatch:
    """``row`` (B = 1) batched with rows of the same shapes drawn from ``others`` (seed, magnitude), at ``at``."""

    row: AttentionCase
    others: tuple[tuple[int, float], ...]
    at: int
    perm_seed: int
    cuts: tuple[int, ...]  # query chunk boundaries

    @property
    def B(self) -> int:
        return 1 + len(self.others)

    def alone(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.row.tensors()

    def batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, ...) with the row at ``at``, laid out as the row is."""
        rows = [dataclasses.replace(self.row, seed=s, magnitude=m).tensors() for s, m in self.others]
        rows.insert(self.at, self.alone())
        return tuple(self.row.laid_out(torch.cat(t), name) for t, name in zip(zip(*rows, strict=True), ARGUMENTS[:3],
                                                                          strict=True))


@st.composite
def attention_batches(draw: st.DrawFn, dtypes: tuple[str, ...], devices: tuple[str, ...], max_len: int = 64,
                      max_d: int = 32, max_batch: int = 5) -> AttentionBatch:
    """Rows of up to max_len queries and keys, head dims up to max_d (the shapes where batch-dependent choices
    -- split-K below a batch size, a GEMV for one row -- already show, at a fraction of the cost)."""
    case = draw(attention_cases(dtypes=dtypes, devices=devices, max_len=max_len, max_d=max_d))
    row = dataclasses.replace(case, B=1, d=min(case.d, max_d), dtype=draw(precise(dtypes)))
    others = draw(st.lists(st.tuples(seeds, st.sampled_from(MAGNITUDES)), max_size=max_batch - 1))
    return AttentionBatch(row=row, others=tuple(others), at=draw(st.integers(0, len(others))), perm_seed=draw(seeds),
                          cuts=draw(cuts(row.Nq)))


# --- paged attention -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PagedBatch:
    """``case``'s B sequences (ragged lengths, shuffled shared pool); row ``at`` is also computed alone."""

    case: PagedAttentionCase
    at: int
    perm_seed: int
    cuts: tuple[int, ...]


@st.composite
def paged_batches(draw: st.DrawFn, dtypes: tuple[str, ...], devices: tuple[str, ...]) -> PagedBatch:
    case = draw(paged_attention_cases(dtypes=dtypes, devices=devices, max_len=96, wide=False))
    case = dataclasses.replace(case, dtype=draw(precise(dtypes)))
    more = draw(st.lists(st.integers(case.Nq, 96), max_size=3))  # up to 6 sequences, none shorter than Nq
    case = dataclasses.replace(case, B=case.B + len(more), seq_lens=case.seq_lens + tuple(more))
    return PagedBatch(case=case, at=draw(st.integers(0, case.B - 1)), perm_seed=draw(seeds), cuts=draw(cuts(case.Nq)))


# --- KV-cache decoding ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeSchedule:
    """``case``'s sequences (prompt, then its column of ``case.steps``) decoded together, permuted, and as a
    serving engine with continuous batching and recompute preemption runs them: in ``epochs``, each a
    prefill of some rows (in that order) with everything they have so far, then ``steps`` steps of them;
    rows join in a later epoch and leave when not scheduled."""

    case: DecodeCase
    perm_seed: int
    epochs: tuple[tuple[tuple[int, ...], int], ...]  # (rows, steps)


@st.composite
def decode_schedules(draw: st.DrawFn, dtypes: tuple[str, ...], max_batch: int = 4) -> DecodeSchedule:
    case = draw(decode_cases(dtypes=dtypes, batch=(1, max_batch), max_prompt=8, max_steps=4))
    n, done, epochs = len(case.steps), [0] * len(case.prompts), []
    for _ in range(draw(st.integers(1, 4))):
        rows = draw(st.lists(st.sampled_from(range(len(case.prompts))), min_size=1, max_size=len(case.prompts),
                             unique=True))
        steps = draw(st.integers(0, n - max(done[r] for r in rows)))
        for r in rows:
            done[r] += steps
        epochs.append((tuple(rows), steps))
    return DecodeSchedule(case=case, perm_seed=draw(seeds), epochs=tuple(epochs))


# --- quantized linear layers ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LinearBatch:
    """``case``'s n tokens (outlier columns, all-zero rows) as one batch; row ``at`` is also computed alone."""

    case: LinearCase
    at: int
    perm_seed: int


@st.composite
def linear_batches(draw: st.DrawFn, dtypes: tuple[str, ...], devices: tuple[str, ...],
                   multiple_of: int = 1) -> LinearBatch:
    case = draw(linear_cases(dtypes=dtypes, devices=devices, multiple_of=multiple_of))
    return LinearBatch(case=case, at=draw(st.integers(0, case.n - 1)), perm_seed=draw(seeds))


# --- speculative samplers ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplerBatch:
    """``case``'s prompt and ``others`` sampled together, row b with its own generator seeded ``seeds[b]``;
    ``case.prompt`` sits at ``at``."""

    case: SpeculativeCase
    others: tuple[tuple[int, ...], ...]
    seeds: tuple[int, ...]
    at: int
    perm_seed: int

    def prompts(self) -> list[list[int]]:
        rows = [list(p) for p in self.others]
        rows.insert(self.at, list(self.case.prompt))
        return rows


@st.composite
def sampler_batches(draw: st.DrawFn, max_batch: int = 5) -> SamplerBatch:
    case = draw(speculative_cases(max_T=6))
    prompt = st.lists(st.integers(0, case.V - 1), min_size=1, max_size=4).map(tuple)
    others = draw(st.lists(prompt, max_size=max_batch - 1))
    return SamplerBatch(case=case, others=tuple(others), seeds=tuple(draw(st.lists(seeds, min_size=len(others) + 1,
                                                                                   max_size=len(others) + 1))),
                        at=draw(st.integers(0, len(others))), perm_seed=draw(seeds))
