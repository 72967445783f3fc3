"""Exact output distributions of samplers written against `harness.lm.Rng`, by visiting every branch.

A sampler is re-run from the start once per branch with a `ReplayRng` that follows a recorded prefix of
choices and, at the first new choice, takes the first outcome of non-zero probability and pushes the
others as new prefixes (each with its probability): a depth-first search over choice sequences.  Each
run's probability is the product of the probabilities of its choices, in float64; zero-probability
outcomes are never visited; model calls are memoized by prefix, a miss scoring all V siblings of the
prefix in one batched call.

Rounds are merged (``merge=True``, the default): a run is cut at the first model call after its first
target call -- the start of round two -- when that call's prefix extends the prompt by the emitted
tokens e, and the rest of the distribution is the (memoized) distribution of the sampler started afresh
from prompt + e with the budget left, composed once per distinct e.  This is exact for samplers whose
rounds depend only on the tokens so far (the contract asks for it: no state carried between rounds, such
as an adaptive gamma); a sampler that carries state declares ``caps={"markov": False}`` and is
enumerated run by run.

Cost: one run per branch of a round, so at least one per distinct output of a round (V^(gamma+1) for a
fully accepted round); a run replays its recorded choices without reading a tensor, but the sampler's
own tensor work is repeated each time.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from harness.lm import LM, check_distribution, check_probability


class ReplayRng:
    """Follows `path`; at each new choice takes the first possible outcome and pushes the alternatives.

    A pushed alternative carries its probability (the product of its choices' weights, in order), so a
    replayed choice is a list lookup: no tensor is read until the run goes past its recorded path.
    """

    def __init__(self, path: list[int], stack: list, prob: float = 1.0) -> None:
        self.path, self.stack, self.taken, self.prob = path, stack, list(path), prob
        self.depth = 0  # choices made so far in this run

    def _choose(self, weights) -> int:
        """A choice past the recorded path: take the first possible outcome, push the others."""
        options = [i for i, w in enumerate(weights) if w > 0]
        prob = self.prob
        self.stack.extend((self.taken + [o], prob * weights[o]) for o in reversed(options[1:]))
        self.taken.append(options[0])
        self.prob = prob * weights[options[0]]
        return options[0]

    def categorical(self, probs: torch.Tensor) -> torch.Tensor:
        depth = self.depth
        if probs.dim() == 1 and depth < len(self.path):
            self.depth = depth + 1
            return _scalar(self.path[depth])
        if depth >= len(self.path):
            check_distribution(probs, "rng.categorical")
        if probs.dim() == 1:
            self.depth = depth + 1
            return _scalar(self._choose(probs.tolist()))
        rows = probs.reshape(-1, probs.shape[-1])  # (rows, V)
        return torch.tensor([self._next(r) for r in rows]).reshape(probs.shape[:-1])

    def bernoulli(self, probs) -> torch.Tensor:
        depth = self.depth
        if depth < len(self.path) and isinstance(probs, torch.Tensor) and probs.dim() == 0:
            self.depth = depth + 1
            return _BOOLS[self.path[depth]]
        probs = torch.as_tensor(probs, dtype=torch.float64)
        if depth >= len(self.path):
            check_probability(probs, "rng.bernoulli")
        flat = probs.reshape(-1).tolist()
        picks = [bool(self._next(None, x)) for x in flat]
        return _BOOLS[picks[0]] if probs.dim() == 0 else torch.tensor(picks).reshape(probs.shape)

    def _next(self, row, bernoulli_p: float | None = None) -> int:
        depth = self.depth
        self.depth = depth + 1
        if depth < len(self.path):
            return self.path[depth]
        return self._choose(row.tolist() if bernoulli_p is None else (1.0 - bernoulli_p, bernoulli_p))


# Replays return shared 0-dim tensors: creating a fresh one costs more than the rest of a choice.
_BOOLS = (torch.tensor(False), torch.tensor(True))
_SCALARS: list[torch.Tensor] = []


def _scalar(i: int) -> torch.Tensor:
    while len(_SCALARS) <= i:
        _SCALARS.append(torch.tensor(len(_SCALARS)))
    return _SCALARS[i]


def explore(run: Callable[[ReplayRng], Hashable], bar=None) -> Iterator[tuple[Hashable, float]]:
    """Yield (outcome, probability) for every branch of ``run``; the probabilities sum to one."""
    stack: list[tuple[list[int], float]] = [([], 1.0)]
    while stack:
        path, prob = stack.pop()
        rng = ReplayRng(path, stack, prob)
        try:
            outcome = run(rng)
        except _Cut as cut:
            outcome = ("cut", cut.emitted)
        if bar is not None:
            bar.update()
        yield outcome, rng.prob


class _Cut(BaseException):  # BaseException: a sampler's `except Exception` must not swallow it
    def __init__(self, emitted: tuple[int, ...]) -> None:
        self.emitted = emitted


class _Memo:
    """Each (prefix, n) reaches the model once.  A miss scores the prefix together with its siblings (the
    same prefix ending in every other token) in one batched call: the enumeration visits every possible
    token there, and one call over V rows costs about as much as one over a single row."""

    def __init__(self, lm: LM) -> None:
        self.lm, self.vocab_size, self.cache, self.misses = lm, lm.vocab_size, {}, 0

    def __call__(self, prefixes, n=1):
        rows = []
        for x in prefixes:
            key = (tuple(x), n)
            if key not in self.cache:
                self._fill(key[0], n)
            rows.append(self.cache[key])
        return rows[0] if len(rows) == 1 else torch.cat(rows)  # (B, n, V)

    def _fill(self, x: tuple[int, ...], n: int) -> None:
        siblings = [x[:-1] + (v,) for v in range(self.vocab_size)]
        missing = [s for s in siblings if (s, n) not in self.cache]
        self.misses += 1
        scored = self.lm([list(s) for s in missing], n)  # (len(missing), n, V)
        self.cache.update(((s, n), scored[i : i + 1]) for i, s in enumerate(missing))


class _Watch:
    """Counts target calls of the current run and cuts it at the start of its second round."""

    def __init__(self, lm: LM, run: _Run, is_target: bool) -> None:
        self.lm, self.vocab_size, self.run, self.is_target = lm, lm.vocab_size, run, is_target

    def __call__(self, prefixes, n=1):
        run = self.run
        if run.cut and run.target_calls and len(prefixes) == 1:
            x = prefixes[0]
            if len(x) > len(run.prompt) and tuple(x[: len(run.prompt)]) == run.prompt:
                raise _Cut(tuple(x[len(run.prompt) :]))
        if self.is_target:
            run.target_calls += 1
        return self.lm(prefixes, n)


@dataclass
class _Run:
    prompt: tuple[int, ...] = ()
    cut: bool = True
    target_calls: int = 0


@dataclass
class Enumeration:
    dist: dict[tuple[int, ...], float]  # first T output tokens -> exact probability
    runs: int  # sampler runs (branches visited)
    states: int  # distinct (prefix, budget) round starts
    model_calls: int  # calls that reached the models (after memoization)
    seconds: float

    @property
    def mass_error(self) -> float:
        return abs(sum(self.dist.values()) - 1.0)


def tokens_of(generation) -> list[int]:
    return list(getattr(generation, "tokens", generation))


def exact_distribution(
    sampler: Callable, target: LM, draft: LM | None, prompt: Sequence[int], *, gamma: int, T: int,
    eos: int | None = None, merge: bool = True, progress: bool = False, **kwargs,
) -> Enumeration:
    """The exact distribution of the first T tokens ``sampler`` generates (a budget of T tokens)."""
    start = time.perf_counter()
    run = _Run()
    memo_t, memo_d = _Memo(target), (_Memo(draft) if draft is not None else None)
    watched_t, watched_d = _Watch(memo_t, run, True), (_Watch(memo_d, run, False) if memo_d else None)
    table: dict[tuple[tuple[int, ...], int], dict] = {}
    bar = tqdm(disable=not progress, unit=" runs", desc="enumerating", mininterval=1.0)
    counts = {"runs": 0}

    def one_run(ctx: tuple[int, ...], budget: int):
        def go(rng):
            run.prompt, run.cut, run.target_calls = ctx, merge, 0
            out = sampler(watched_t, watched_d, list(ctx), gamma=gamma, max_new_tokens=budget, rng=rng, eos=eos,
                          **kwargs)
            return ("done", check_output(tokens_of(out), budget, target.vocab_size))
        return go

    def dist(ctx: tuple[int, ...], budget: int) -> dict:
        if (ctx, budget) in table:
            return table[(ctx, budget)]
        out: dict[tuple[int, ...], float] = defaultdict(float)
        cut: dict[tuple[int, ...], float] = defaultdict(float)  # round one's tokens -> P(round one emits them)
        for (kind, tokens), prob in explore(one_run(ctx, budget), bar):
            counts["runs"] += 1
            if kind == "done" or len(tokens) >= budget:
                out[tokens[:budget]] += prob
            else:
                cut[tokens] += prob
        # Composed once per distinct round outcome, not once per run: thousands of runs (the drafts a
        # rejection discards) end in the same tokens, and each would otherwise walk the whole sub-distribution.
        for tokens, prob in cut.items():
            for tail, q in dist(ctx + tokens, budget - len(tokens)).items():
                out[tokens + tail] += prob * q
        table[(ctx, budget)] = dict(out)
        return table[(ctx, budget)]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny model calls: a thread pool costs more than it saves
    try:
        result = dist(tuple(prompt), T)
    finally:
        torch.set_num_threads(threads)
        bar.close()
    calls = memo_t.misses + (memo_d.misses if memo_d else 0)
    return Enumeration(result, counts["runs"], len(table), calls, time.perf_counter() - start)


def first_round(
    sampler: Callable, target: LM, draft: LM | None, prompt: Sequence[int], *, gamma: int, budget: int,
    eos: int | None = None,
) -> dict[tuple[int, int], float]:
    """Exact distribution of (tokens emitted, target calls made) in the sampler's first round."""
    run = _Run(tuple(prompt))
    watched_t = _Watch(_Memo(target), run, True)
    watched_d = _Watch(_Memo(draft), run, False) if draft is not None else None

    def go(rng):
        run.target_calls = 0
        out = sampler(watched_t, watched_d, list(prompt), gamma=gamma, max_new_tokens=budget, rng=rng, eos=eos)
        return ("done", check_output(tokens_of(out), budget, target.vocab_size))

    outcomes: dict[tuple[int, int], float] = defaultdict(float)
    for (_, tokens), prob in explore(go):
        outcomes[(len(tokens), run.target_calls)] += prob
    return dict(outcomes)


def check_output(tokens: list, budget: int, vocab_size: int) -> tuple[int, ...]:
    if len(tokens) > budget:
        raise AssertionError(f"sampler returned {len(tokens)} tokens, more than max_new_tokens={budget}")
    if not all(isinstance(t, int) and 0 <= t < vocab_size for t in tokens):
        raise AssertionError(f"sampler returned tokens {tokens} that are not ints in [0, {vocab_size})")
    return tuple(tokens)


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def max_difference(a: dict, b: dict) -> tuple[float, Hashable]:
    return max(((abs(a.get(k, 0.0) - b.get(k, 0.0)), k) for k in set(a) | set(b)), default=(0.0, ()))
