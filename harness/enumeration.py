"""Exact output distributions of samplers written against `harness.lm.Rng`, by visiting every branch.

A sampler is re-run from the start once per branch with a `ReplayRng` that follows a recorded prefix of
choices and, at the first new choice, takes the first outcome of non-zero probability and pushes the
others as new prefixes (each with its probability): a depth-first search over choice sequences.  Each
run's probability is the product of the probabilities of its choices, in float64; zero-probability
outcomes are never visited; model calls are memoized by prefix, a miss scoring all V siblings of the
prefix in one batched call.

Rounds are merged (``merge=True``, the default).  The first model call after the first target call
whose single prefix extends the prompt (by e) may start round two: if it ends in the token of the last
categorical draw since the target call (a round ends by drawing its last token), the run is cut there
and the rest of the distribution is the (memoized) distribution of the sampler started afresh from
prompt + e with the budget left, composed once per distinct e; otherwise the run is played out to the
end, which is always exact.  That call cannot tell a draft catching up on the drafted tokens before the
draw from the start of a round that drew no last token (all drafts accepted, no bonus): both call the
draft on the verified prefix.  A sampler whose every round ends with a draw may declare its calls
before it catch-up calls (``catch_up=True``, from ``caps={"catch_up_calls": True}``): the watch then
goes on to the first call that ends in a token drawn since the target call.  Cutting is exact for
samplers whose rounds depend only on the tokens so far (the contract asks for it: no state carried
between rounds, such as an adaptive gamma); a sampler that carries state declares
``caps={"markov": False}`` and is enumerated run by run.

Cost: one run per branch of a round, so at least one per distinct output of a round (V^(gamma+1) for a
fully accepted round); a run replays its recorded choices without reading a tensor, but the sampler's
own tensor work is repeated each time (~50 us a run for `standard` on the tiny models).

Parallel: branches and round states are independent, so past ``parallel_after_runs`` runs (an enumeration
big enough to pay for a fork) the pending branches of the current round, then the round states it leads
to, one level at a time, go to ``workers`` forked processes; this process composes the rounds.  Each
worker memoizes model calls on its own, and what a model caches itself in a worker (`PerPrefix` rows)
stays there: a reference that must see the same float32 rows is computed before the enumeration.

The tiny target with the good draft, gamma 2, T 3 (709,796 runs over 1,970 round states) takes 26-29 s
on two cores shared with other work.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import time
import traceback
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
        if depth < len(self.path) and (type(probs) is float or isinstance(probs, torch.Tensor) and probs.dim() == 0):
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
        outcome, prob = _branch(run, path, prob, stack)
        if bar is not None:
            bar.update()
        yield outcome, prob


def _branch(run: Callable[[ReplayRng], Hashable], path: list[int], prob: float, stack: list):
    """One run along ``path`` (probability ``prob``), pushing the branches it passes onto ``stack``."""
    rng = ReplayRng(path, stack, prob)
    try:
        outcome = run(rng)
    except _Cut as cut:
        outcome = ("cut", cut.emitted)
    return outcome, rng.prob


class _Cut(BaseException):  # BaseException: a sampler's `except Exception` must not swallow it
    def __init__(self, emitted: tuple[int, ...]) -> None:
        self.emitted = emitted


class _Model:
    """A model as the enumerated sampler sees it: memoized, and watched for the start of round two.

    Each (prefix, n) reaches the model once.  A miss scores the prefix together with its siblings (the
    same prefix ending in every other token) in one batched call: the enumeration visits every possible
    token there, and one call over V rows costs about as much as one over a single row.  Target calls of
    the current run are counted, and a run is cut (`_Cut`) at the first call of its second round.
    """

    def __init__(self, lm: LM, run: _Run, is_target: bool) -> None:
        self.lm, self.vocab_size, self.run, self.is_target = lm, lm.vocab_size, run, is_target
        self.cache: dict[tuple[tuple[int, ...], int], torch.Tensor] = {}
        self.misses = 0

    def __call__(self, prefixes, n=1):
        run = self.run
        if run.cut and run.target_calls and len(prefixes) == 1:
            x, prompt = prefixes[0], run.prompt
            if len(x) > len(prompt) and tuple(x[: len(prompt)]) == prompt:  # a call that may start round two
                if x[-1] == run.last_draw:
                    raise _Cut(tuple(x[len(prompt) :]))
                run.cut = run.catch_up  # no token drawn since the target call, or another one: play this run
                # out, unless the sampler declared that its calls before the round's last draw are catch-up calls
        if self.is_target:
            run.target_calls += 1
            run.last_draw = None
        if len(prefixes) == 1:  # the common case, without building a list
            key = (tuple(prefixes[0]), n)
            row = self.cache.get(key)
            if row is None:
                self._fill(key[0], n)
                row = self.cache[key]
            return row  # (1, n, V)
        rows = []
        for x in prefixes:
            key = (tuple(x), n)
            if key not in self.cache:
                self._fill(key[0], n)
            rows.append(self.cache[key])
        return torch.cat(rows)  # (B, n, V)

    def _fill(self, x: tuple[int, ...], n: int) -> None:
        siblings = [x[:-1] + (v,) for v in range(self.vocab_size)]
        missing = [s for s in siblings if (s, n) not in self.cache]
        self.misses += 1
        scored = self.lm([list(s) for s in missing], n)  # (len(missing), n, V)
        self.cache.update(((s, n), scored[i : i + 1]) for i, s in enumerate(missing))


@dataclass
class _Run:
    prompt: tuple[int, ...] = ()
    cut: bool = True
    catch_up: bool = False  # calls between the target call and the round's last draw belong to the round
    target_calls: int = 0
    last_draw: int | None = None  # the token of the last categorical draw since the last target call

    def start(self, prompt: tuple[int, ...], cut: bool) -> None:
        self.prompt, self.cut, self.target_calls, self.last_draw = prompt, cut, 0, None


class _WatchedRng:
    """The rng as an enumerated sampler sees it: notes each token drawn after a target call."""

    def __init__(self, rng, run: _Run) -> None:
        self.rng, self.run = rng, run

    def categorical(self, probs):
        token = self.rng.categorical(probs)
        if self.run.target_calls:  # one token (a batch of one too), or None for several rows
            self.run.last_draw = int(token.reshape(-1)[0]) if token.numel() == 1 else None
        return token

    def bernoulli(self, probs):
        return self.rng.bernoulli(probs)


@dataclass
class Enumeration:
    dist: dict[tuple[int, ...], float]  # first T output tokens -> exact probability
    runs: int  # sampler runs (branches visited)
    states: int  # distinct (prefix, budget) round starts
    model_calls: int  # calls that reached the models (after memoization; each worker has its own memo)
    seconds: float
    workers: int = 1  # processes that ran the sampler (1: no fork)

    @property
    def mass_error(self) -> float:
        return abs(sum(self.dist.values()) - 1.0)


def tokens_of(generation) -> list[int]:
    return list(getattr(generation, "tokens", generation))


PARALLEL_AFTER_RUNS = 20_000  # ~1 s of runs: below this a fork (and each worker's cold memo) costs more than it saves
MAX_WORKERS = 8


def can_fork() -> bool:
    """Whether this process may fork workers: not where the platform has no fork, nor in a daemonic process
    (multiprocessing forbids it children; `harness check` runs each implementation in one)."""
    return "fork" in multiprocessing.get_all_start_methods() and not multiprocessing.current_process().daemon


def default_workers() -> int:
    """The CPUs this process may use (at most MAX_WORKERS)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


def exact_distribution(
    sampler: Callable, target: LM, draft: LM | None, prompt: Sequence[int], *, gamma: int, T: int,
    eos: int | None = None, merge: bool = True, catch_up: bool = False, progress: bool = False,
    workers: int | None = None,
    parallel_after_runs: int = PARALLEL_AFTER_RUNS, **kwargs,
) -> Enumeration:
    """The exact distribution of the first T tokens ``sampler`` generates (a budget of T tokens).

    Runs sequentially for ``parallel_after_runs`` runs, then forks ``workers`` processes (default: the CPUs
    available; 1 never forks) that take the pending branches of the current round state, then whole round
    states, one level of rounds at a time; this process composes the rounds.  The result is the same
    distribution, summed in another order; a sampler's exception is raised here with the worker's
    traceback as its cause.
    """
    workers = default_workers() if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"exact_distribution: workers must be an int >= 1, got {workers!r}")
    if not can_fork():  # the one check, for a default or a requested count alike
        workers = 1
    start = time.perf_counter()

    def call(t, d, ctx, budget, rng):
        return sampler(t, d, ctx, gamma=gamma, max_new_tokens=budget, rng=rng, eos=eos, **kwargs)

    enumerator = _Enumerator(call, target, draft, merge, catch_up, workers, parallel_after_runs, progress)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny model calls: a thread pool costs more than it saves
    try:
        result = enumerator.dist(tuple(prompt), T)
    finally:
        torch.set_num_threads(threads)
        enumerator.close()
    return Enumeration(result, enumerator.runs, len(enumerator.table), enumerator.model_calls(),
                       time.perf_counter() - start, enumerator.pool.n if enumerator.pool.started else 1)


class _Enumerator:
    """One enumeration: the watched models, each round state's runs and composed distribution, the workers.

    A round state is (tokens so far, budget left).  `round_of` visits its branches; `dist` composes its
    finished outputs with the distributions of the round states its cut runs lead to."""

    def __init__(self, call: Callable, target: LM, draft: LM | None, merge: bool, catch_up: bool, workers: int,
                 parallel_after_runs: int, progress: bool) -> None:
        self.call, self.merge, self.parallel_after_runs = call, merge, parallel_after_runs
        self.run = _Run(catch_up=catch_up)
        self.target = _Model(target, self.run, True)
        self.draft = _Model(draft, self.run, False) if draft is not None else None
        self.pool = _Workers(workers, self.task)
        self.rounds: dict[tuple[tuple[int, ...], int], _Round] = {}  # a round state's own runs
        self.table: dict[tuple[tuple[int, ...], int], dict] = {}  # a round state's composed distribution
        self.bar = tqdm(disable=not progress, unit=" runs", desc="enumerating", mininterval=1.0)
        self.runs = self.worker_calls = 0

    def misses(self) -> int:
        return self.target.misses + (self.draft.misses if self.draft else 0)

    def model_calls(self) -> int:
        return self.misses() + self.worker_calls

    def one_run(self, ctx: tuple[int, ...], budget: int) -> Callable:
        run, call, target, draft, V = self.run, self.call, self.target, self.draft, self.target.vocab_size

        def go(rng):
            run.start(ctx, self.merge)
            out = call(target, draft, prompt := list(ctx), budget, _WatchedRng(rng, run))
            return ("done", check_output(tokens_of(out), budget, V, prompt, ctx))
        return go

    def explore_branches(self, ctx: tuple[int, ...], budget: int, stack: list, after_run=None) -> _Round:
        """Run the branches on ``stack`` of the round started at (ctx, budget) and every branch they reach;
        ``after_run(found, state, stack)`` is called after each run and may take the rest of the stack."""
        go, found = self.one_run(ctx, budget), _Round()
        out, cut = found.out, found.cut
        while stack:
            path, prob = stack.pop()
            (kind, tokens), prob = _branch(go, path, prob, stack)
            found.runs += 1
            if kind == "done" or len(tokens) >= budget:
                out[tokens[:budget]] += prob
            else:
                cut[tokens] += prob  # round one's tokens -> P(round one emits them)
            if after_run is not None:
                after_run(found, (ctx, budget), stack)
        return found

    def task(self, ctx: tuple[int, ...], budget: int, stack: list) -> tuple[_Round, int]:
        """A worker's share: the whole subtree of the branches on ``stack``, and the model calls it made."""
        before = self.misses()
        found = self.explore_branches(ctx, budget, stack)
        return found, self.misses() - before

    def received(self, found: _Round, calls: int) -> _Round:
        self.runs += found.runs
        self.worker_calls += calls
        self.bar.update(found.runs)
        return found

    def after_run(self, found: _Round, state, stack: list) -> None:
        """Count the run; past ``parallel_after_runs``, give the pending branches to the workers."""
        self.runs += 1
        self.bar.update()
        if self.runs >= self.parallel_after_runs and stack and self.pool.start():
            pending = [(*state, [branch]) for branch in stack]  # the bottom of the stack, shallowest, first
            stack.clear()
            for share, calls in self.pool.map(pending):
                found.add(self.received(share, calls))

    def round_of(self, ctx: tuple[int, ...], budget: int) -> _Round:
        if (ctx, budget) not in self.rounds:
            self.rounds[(ctx, budget)] = self.explore_branches(ctx, budget, [([], 1.0)], self.after_run)
        return self.rounds[(ctx, budget)]

    def prefetch(self, states: list) -> None:
        """Explore ``states`` and every round state they lead to in the workers, one level at a time."""
        rounds = self.rounds
        level = list(dict.fromkeys(s for s in states if s not in rounds))
        while level:
            level.sort(key=lambda s: -s[1])  # bigger budgets, bigger rounds: first
            tasks = [(ctx, budget, [([], 1.0)]) for ctx, budget in level]
            for state, (found, calls) in zip(level, self.pool.map(tasks, ordered=True), strict=True):
                rounds[state] = self.received(found, calls)
            level = list(dict.fromkeys((ctx + t, budget - len(t)) for ctx, budget in level
                                       for t in rounds[(ctx, budget)].cut if (ctx + t, budget - len(t)) not in rounds))

    def dist(self, ctx: tuple[int, ...], budget: int) -> dict:
        if (ctx, budget) in self.table:
            return self.table[(ctx, budget)]
        found = self.round_of(ctx, budget)
        out = defaultdict(float, found.out)
        prefetched = False
        # Composed once per distinct round outcome, not once per run: thousands of runs (the drafts a
        # rejection discards) end in the same tokens, and each would otherwise walk the whole sub-distribution.
        for tokens, prob in found.cut.items():
            if self.pool.started and not prefetched:
                self.prefetch([(ctx + t, budget - len(t)) for t in found.cut])
                prefetched = True
            for tail, q in self.dist(ctx + tokens, budget - len(tokens)).items():
                out[tokens + tail] += prob * q
        self.table[(ctx, budget)] = dict(out)
        return self.table[(ctx, budget)]

    def close(self) -> None:
        self.bar.close()
        self.pool.close()


class _Round:
    """What the runs of one round state found: outputs finished within the round, and round one's tokens
    where a run was cut (to be composed with the distribution from there)."""

    def __init__(self) -> None:
        self.out: dict[tuple[int, ...], float] = defaultdict(float)
        self.cut: dict[tuple[int, ...], float] = defaultdict(float)
        self.runs = 0

    def add(self, other: _Round) -> None:
        for mine, theirs in ((self.out, other.out), (self.cut, other.cut)):
            for k, v in theirs.items():
                mine[k] += v
        self.runs += other.runs


_JOB: Callable | None = None  # what a forked worker runs: set, under _FORK_LOCK, just before the fork
_FORK_LOCK = threading.Lock()


def _start_worker() -> None:
    torch.set_num_threads(1)  # two cores, two workers: intra-op threads would only contend


def _work(task: tuple):
    """A worker's entry point: ("ok", result) or ("error", exception, formatted traceback)."""
    try:
        return "ok", _JOB(*task), ""
    except BaseException as exc:  # noqa: BLE001 - everything a sampler raises travels back to the caller
        text = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle travels as its text
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        return "error", exc, text


class _RemoteTraceback(Exception):
    """The cause of an exception re-raised from a worker: the traceback the worker formatted."""

    def __str__(self) -> str:
        return f"\n(in an enumeration worker)\n{self.args[0]}"


class _Workers:
    """``n`` forked processes running ``job``, started on first use; errors re-raised with their traceback."""

    def __init__(self, n: int, job: Callable) -> None:
        self.n, self.job, self.pool = n, job, None

    @property
    def started(self) -> bool:
        return self.pool is not None

    def start(self) -> bool:
        global _JOB
        if self.pool is None and self.n > 1:
            with _FORK_LOCK:
                _JOB = self.job
                try:
                    self.pool = multiprocessing.get_context("fork").Pool(self.n, initializer=_start_worker)
                finally:
                    _JOB = None
        return self.pool is not None

    def map(self, tasks: list, ordered: bool = False) -> Iterator:
        results = (self.pool.imap if ordered else self.pool.imap_unordered)(_work, tasks)
        for status, result, text in results:
            if status == "error":
                raise result from _RemoteTraceback(text)
            yield result

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def first_round(
    sampler: Callable, target: LM, draft: LM | None, prompt: Sequence[int], *, gamma: int, budget: int,
    eos: int | None = None, catch_up: bool = False,
) -> dict[tuple[int, int], float]:
    """Exact distribution of (tokens emitted, target calls made) in the sampler's first round."""
    run = _Run(tuple(prompt), catch_up=catch_up)
    watched_t = _Model(target, run, True)
    watched_d = _Model(draft, run, False) if draft is not None else None

    def go(rng):
        run.start(tuple(prompt), True)
        given = list(prompt)
        out = sampler(watched_t, watched_d, given, gamma=gamma, max_new_tokens=budget, rng=_WatchedRng(rng, run),
                      eos=eos)
        return ("done", check_output(tokens_of(out), budget, target.vocab_size, given, tuple(prompt)))

    outcomes: dict[tuple[int, int], float] = defaultdict(float)
    for (_, tokens), prob in explore(go):
        outcomes[(len(tokens), run.target_calls)] += prob
    return dict(outcomes)


def check_output(tokens: list, budget: int, vocab_size: int, given: list, prompt: tuple) -> tuple[int, ...]:
    """The tokens as a tuple, once they and the prompt list the sampler was given pass the contract."""
    if tuple(given) != prompt:  # `ctx = prompt; ctx += ...`: the caller's prompt grows (a real aliasing bug)
        raise AssertionError(f"mutated its input prompt: {list(prompt)} became {given} (inputs must be left "
                             "unchanged; copy a list before extending it)")
    if len(tokens) > budget:
        raise AssertionError(f"sampler returned {len(tokens)} tokens, more than max_new_tokens={budget}")
    if set(map(type, tokens)) <= _INT and (not tokens or 0 <= min(tokens) and max(tokens) < vocab_size):
        return tuple(tokens)  # the fast path: no generator per run
    if not all(isinstance(t, int) and 0 <= t < vocab_size for t in tokens):
        raise AssertionError(f"sampler returned tokens {tokens} that are not ints in [0, {vocab_size})")
    return tuple(tokens)


_INT = {int}


def max_difference(a: dict, b: dict) -> tuple[float, Hashable]:
    return max(((abs(a.get(k, 0.0) - b.get(k, 0.0)), k) for k in set(a) | set(b)), default=(0.0, ()))
