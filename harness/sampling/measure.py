"""Measuring samplers on the tiny models: acceptance rate, documents sampled with and without a draft, and
models whose sessions keep time.  Used by benchmarks/bench_speculative.py and the report.

Ratios are measured within one process, the samplers taking turns document by document, so that load on a
shared machine falls on all alike.
"""

from __future__ import annotations

import time

import torch

from llm_inference_harness.sampling.lm import session

BOS_TOKENS = 120  # tokens generated per timed sequence (the context holds 128)
DOCUMENTS = 16  # documents per sampler in a wall-clock ratio (they end at EOS: 26 tokens on average)


def acceptance(target, draft, docs) -> float:
    """Mean over the positions of held-out documents of sum(min(p, q)) (teacher-forced contexts)."""
    rates = []
    for doc in docs:
        p, q = target([doc], len(doc))[0], draft([doc], len(doc))[0]  # (L, V) each
        rates.append(torch.minimum(p, q).sum(-1))
    return float(torch.cat(rates).mean())


def plain_cached(target, prompt, n: int, rng, eos=None) -> list[int]:
    """The baseline: autoregressive sampling with the target's KV cache (one cached step per token)."""
    s, out = session(target), []
    p = s.extend(prompt)[-1]
    while len(out) < n and (not out or out[-1] != eos):
        out.append(int(rng.categorical(p)))
        p = s.extend(out[-1:])[-1]
    return out


def document(sampler, target, draft, gamma: int, rng, bos: int, eos: int) -> list[int]:
    """One document from BOS to EOS (at most BOS_TOKENS tokens): plain KV-cached sampling when gamma is 0,
    ``sampler`` (a speculative sampler's function) with the draft otherwise."""
    if gamma == 0:
        return plain_cached(target, [bos], BOS_TOKENS, rng, eos)
    return sampler(target, draft, [bos], gamma=gamma, max_new_tokens=BOS_TOKENS, rng=rng, eos=eos).tokens


def warm_up(samplers, rng) -> None:
    """One untimed document each (seed DOCUMENTS): first calls of ops cost extra."""
    for sample in samplers:
        sample(rng(DOCUMENTS))


def run_documents(samplers, rng) -> tuple[list[float], list[int]]:
    """Seconds and tokens of each sampler(rng) over the documents of seeds 0..DOCUMENTS-1, the samplers
    taking turns document by document with the same seeds, so that load on a shared machine falls on all
    alike."""
    seconds, tokens = [0.0] * len(samplers), [0] * len(samplers)
    for seed in range(DOCUMENTS):
        for i, sample in enumerate(samplers):
            start = time.perf_counter()
            tokens[i] += len(sample(rng(seed)))
            seconds[i] += time.perf_counter() - start
    return seconds, tokens


class TimedSession:
    """A model's session whose extend and rollback add their seconds to clock[key]; the sampler never knows."""

    def __init__(self, inner, clock: dict, key: str) -> None:
        self.inner, self.clock, self.key = inner, clock, key

    def _timed(self, method, *args):
        start = time.perf_counter()
        try:
            return method(*args)
        finally:
            self.clock[self.key] += time.perf_counter() - start

    def extend(self, tokens):
        return self._timed(self.inner.extend, tokens)

    def rollback(self, length):
        self._timed(self.inner.rollback, length)

    @property
    def length(self) -> int:
        return self.inner.length


class Timed:
    """An LM whose sessions are `TimedSession`s on one clock."""

    def __init__(self, lm, clock: dict, key: str) -> None:
        self.lm, self.vocab_size, self.clock, self.key = lm, lm.vocab_size, clock, key

    def __call__(self, prefixes, n=1):
        return self.lm(prefixes, n)

    def session(self) -> TimedSession:
        return TimedSession(session(self.lm), self.clock, self.key)


