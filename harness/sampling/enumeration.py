"""Exact output distributions of samplers written against `llm_inference_harness.sampling.lm.Rng`, by visiting every
branch.

A sampler is re-run once per branch with a `ReplayRng` that follows a recorded prefix of choices and,
past it, takes the first outcome of non-zero probability of each new choice and records the choice.
When the run ends, the alternatives of the choices that belong to the round are pushed as new prefixes
(each with its probability): a depth-first search over choice sequences.  Each run's probability is the
product of the probabilities of its round's choices, in float64; zero-probability outcomes are never
visited; model calls are memoized by prefix, a miss scoring all V siblings of the prefix in one batched
call.

Rounds are merged (``merge=True``, the default), their boundaries read off the target calls, as the
contract's round protocol states (harness/contracts/speculative.py): a round starts with a model call on
the prompt and the tokens emitted so far, and its target call scores its k drafts and the position before
them (n = k + 1).  So the second target call of a run, on prefix x scoring n positions, says that the
first round emitted e = x[len(prompt) : len(x) - n + 1]; the round's own choices are those made before
the last call on prompt + e (round two's start).  The run is cut at that target call, and the rest of the
distribution is the (memoized) distribution of the sampler started afresh from prompt + e with the budget
left, composed once per distinct e.  A second target call that names no such start is no boundary: the
run goes on, and one that never finds one is played out, which is always exact.  Cutting is exact for
samplers whose rounds depend only on the tokens so far (the contract asks for it: no state carried
between rounds, such as an adaptive gamma); a sampler that carries state declares ``caps={"markov":
False}`` and is enumerated run by run (``merge=False``: no cut, no prediction).

The round's last draw is emitted as drawn (the contract's other clause): when the last choice of a round
is a categorical over the vocabulary whose token ends the round's tokens, the round would have emitted the
same tokens with any other token in its place.  One more of its outcomes is run to confirm it (its
tokens, target calls and choices must follow the pattern; once per round state, last-draw position, tokens
before it and weights: the residual after rejecting x_1 is the same whatever x_2 was), an eos outcome is
always run, and the others are settled without a run, as a vector over the vocabulary per head: 65
outcomes of a tiny-model bonus draw cost 2 runs instead of 65.  The eos run and the confirming run keep the
prediction honest for samplers that stop, truncate or drop a draw; the run-by-run mode has no prediction at
all and is what the properties compare with on small cases.

Parallel: branches and round states are independent, so past ``parallel_after_runs`` runs (an enumeration big
enough to pay for a fork: PARALLEL_AFTER_RUNS, ~5 s of runs) the pending branches of the current round, then
the round states it leads to, one level at a time, go to ``workers`` forked processes; this process composes
the rounds. Each worker memoizes model calls on its own, and what a model caches itself in a worker
(`PerPrefix` rows) stays there: a reference that must see the same float32 rows is computed before the
enumeration.

Slow cases say why: past NOTE_AFTER_S seconds (then at every doubling) a note on stderr (and, inside `check`,
printed at once by the parent) splits the time into the sampler's own code, model calls and the enumerator
(naming the largest); past ``deadline_s`` the enumeration stops with that note as an `EnumerationTooSlow`
error. The usual cause, a round drafting past its budget (tokens that are never emitted, each multiplying the
branches by V), stops the enumeration at that round's target call with `DraftsPastBudget`, naming the
contract's budget rule.

The tiny target with the good draft, gamma 2, T 3 (274,625 outputs, 1,970 round states): 709,796 runs when a
round ended at the first call ending in its last categorical draw and every outcome was a run; 22,475 runs now
(687,321 outcomes settled), in one process: below PARALLEL_AFTER_RUNS a fork costs more than it saves
(`bench_speculative.EnumerationGoal` tracks seconds and runs). It takes 2.4-3.7 s of CPU (the wall: 2.4 s at
best, 11-40 s on two cores shared at load 7-10), of which (`Enumeration.split`) ~40% is the sampler's own code
(tensor indexing: four to six small-tensor ops a run), a quarter the target's and draft's forward passes (65
batched sibling calls), a third the enumerator (draws, memo lookups, folds, the 274,625-entry dict). The runs
themselves are the floor: every path to a round's last draw is run once, and every last draw's pattern twice.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import multiprocessing
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from llm_inference_harness.engine import isolation
from llm_inference_harness.engine.guard import is_remote
from llm_inference_harness.engine.progress import progress as progress_bar
from llm_inference_harness.sampling.lm import LM
from llm_inference_harness.sampling.replay import (  # noqa: F401 - ReplayRng, explore, ...: part of this module's face
    DraftsPastBudget,
    PathRunner,
    RemoteRunner,
    ReplayRng,
    RunResult,
    _Clock,
    check_output,
    explore,
    explore_batches,
    past_budget,
    push_alternatives,
    tokens_of,
)
from llm_inference_harness.sampling.workers import Workers

NOTE_AFTER_S = 30.0  # an enumeration running longer prints where its time went


class TooManyBranches(AssertionError):
    """An enumeration past its budget of runs: a sampler whose draws branch further than its case allows."""


def outcome_distribution(run: Callable[[ReplayRng], Hashable], *, max_runs: int,
                         run_many: Callable | None = None) -> dict[Hashable, float]:
    """P(outcome) of ``run`` over every branch of its draws (`explore`, or `explore_batches` of ``run_many``, summed
    per outcome); `TooManyBranches` past ``max_runs`` runs, so that a sampler that keeps drawing gets a verdict, not
    an endless search.  For a sampler of one step (a token per row of a batch) every branch is one run."""
    dist: dict[Hashable, float] = defaultdict(float)
    for runs, (outcome, prob) in enumerate(explore(run) if run_many is None else explore_batches(run_many), 1):
        if runs > max_runs:
            raise TooManyBranches(f"more than {max_runs} branches of the sampler's draws (each run is one branch): it "
                                  "draws more often than one categorical per row and a bounded chain of retries")
        dist[outcome] += prob
    return dict(dist)


@dataclass
class Enumeration:
    dist: dict[tuple[int, ...], float]  # first T output tokens -> exact probability
    runs: int  # sampler runs (branches visited)
    states: int  # distinct (prefix, budget) round starts
    model_calls: int  # calls that reached the models (after memoization; each worker has its own memo)
    seconds: float
    workers: int = 1  # processes that ran the sampler (1: no fork)
    settled: int = 0  # outcomes of a round's last draw settled without a run
    split: dict[str, float] = field(default_factory=dict)  # seconds: sampler's own code, models, enumerator

    @property
    def mass_error(self) -> float:
        return abs(sum(self.dist.values()) - 1.0)


class EnumerationTooSlow(AssertionError):
    """The enumeration ran past its deadline; the message says where the time went."""


# ~5 s of runs: below this a fork costs more than the second core saves (the workers' cold memos recompute
# model rows, every round's result is pickled back); the goal case, 22,475 runs, runs faster in one process
PARALLEL_AFTER_RUNS = 50_000
MAX_WORKERS = 8
MANY_PATHS = 4096  # paths in one message of `_Enumerator.explore_together` (a sampler in its own process)


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
    eos: int | None = None, merge: bool = True, progress: bool = False, workers: int | None = None,
    parallel_after_runs: int = PARALLEL_AFTER_RUNS, deadline_s: float | None = None, budget_rule: bool = True,
    pool: Callable | None = None, **kwargs,
) -> Enumeration:
    """The exact distribution of the first T tokens ``sampler`` generates (a budget of T tokens).

    Runs sequentially for ``parallel_after_runs`` runs, then forks ``workers`` processes (default: the CPUs available; 1
    never forks) that take the pending branches of the current round state, then whole round states, one level of rounds
    at a time; this process composes the rounds.  The result is the same distribution, summed in another order; a
    sampler's exception is raised here with the worker's traceback as its cause.  Past ``deadline_s`` seconds it raises
    `EnumerationTooSlow`; at the first round that drafts past its budget, `DraftsPastBudget` (``budget_rule=False``
    enumerates such a sampler anyway).  ``pool(workers, recipe)`` replaces the forked processes with another pool of the
    same interface (`_Workers`): `llm_inference_harness.engine.enumeration_pool.RayPool` sends the split to a Ray
    cluster, where ``recipe()`` builds the enumerator whose `_Enumerator.task` a worker runs.
    """
    workers = default_workers() if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"exact_distribution: workers must be an int >= 1, got {workers!r}")
    sampler, kwargs = unwrapped(sampler, kwargs)
    if is_remote(sampler) or (pool is None and not can_fork()):  # the one check, for a default or requested count
        workers, pool = 1, None  # (a sampler in its own process runs its batches there: no fork of it from here)

    name = getattr(sampler, "__qualname__", repr(sampler))
    runner = runner_of(sampler, target, draft, eos, merge, budget_rule, dict(gamma=gamma, eos=eos, **kwargs))
    enumerator = _Enumerator(runner, target, eos, merge, workers, parallel_after_runs, progress,
                             _Deadline(name, deadline_s), pool=pool)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny model calls: a thread pool costs more than it saves
    try:
        with heap_frozen():
            if budget_rule and T > 1:
                enumerator.probe_budget(tuple(prompt))
            result = expanded(*enumerator.dist(tuple(prompt), T))
    finally:
        torch.set_num_threads(threads)
        enumerator.close()
    seconds = time.perf_counter() - enumerator.deadline.start
    return Enumeration(result, enumerator.runs, len(enumerator.table), enumerator.model_calls(), seconds,
                       enumerator.pool.n if enumerator.pool.started else 1, enumerator.settled,
                       enumerator.clock.split(seconds))


@contextlib.contextmanager
def heap_frozen():
    """Inside the block, full garbage collections leave out the objects that existed before it (`gc.freeze`): an
    enumeration allocates ~10^5 containers that live for a batch (a remote runner's decoded reports), enough to
    trigger 3-4 full collections, each walking the ~200,000 objects of torch, numpy and Hypothesis (the isolated
    goal case's collections took 0.42-0.57 s, 0.09-0.13 s with the heap frozen).  Left alone where someone else
    froze the heap: unfreezing would undo theirs."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def unwrapped(sampler: Callable, kwargs: dict) -> tuple[Callable, dict]:
    """A ``functools.partial`` of a sampler in the implementation's process, as that sampler and its keywords (its
    runs then go there in batches; a partial run here would call it once per run, the enumerator's own
    exceptions crossing the boundary)."""
    if isinstance(sampler, functools.partial) and is_remote(sampler.func) and not sampler.args:
        return sampler.func, {**sampler.keywords, **kwargs}
    return sampler, kwargs


def runner_of(sampler: Callable, target: LM, draft: LM | None, eos: int | None, merge: bool, budget_rule: bool,
              kwargs: dict) -> Callable:
    """What runs ``sampler`` along paths: here (`PathRunner`), or in the implementation's own process, in batches
    (`RemoteRunner`, when ``sampler`` is a proxy of one: harness/engine/boundary.py)."""
    if is_remote(sampler):
        return lambda clock: RemoteRunner(sampler, target, draft, eos, merge, budget_rule, kwargs)

    def call(t, d, ctx, budget, rng):
        return sampler(t, d, ctx, max_new_tokens=budget, rng=rng, **kwargs)

    return lambda clock: PathRunner(call, target, draft, eos, merge, budget_rule, clock)


class _Deadline:
    """Prints where the time went past NOTE_AFTER_S (then at every doubling); raises past ``limit``."""

    def __init__(self, name: str, limit: float | None) -> None:
        self.name, self.limit, self.start = name, limit, time.perf_counter()
        self.next_note = NOTE_AFTER_S

    def check(self, enumerator: _Enumerator) -> None:
        wall = time.perf_counter() - self.start
        if wall >= self.next_note:
            line = f"enumeration note: {enumerator.note(self.name, wall)}"
            print(line, file=sys.stderr, flush=True)
            isolation.note(line)  # printed by `check` as it happens, not only in the verdict
            self.next_note = 2 * max(self.next_note, wall)
        if self.limit is not None and wall >= self.limit:
            raise EnumerationTooSlow(f"stopped at its deadline ({self.limit:g} s): {enumerator.note(self.name, wall)}")


_PARTS = {"sampler": "the sampler's own code", "models": "model calls", "enumerator": "the enumerator"}


class _Enumerator:
    """One enumeration: the watched models, each round state's runs and composed distribution, the workers.

    A round state is (tokens so far, budget left).  `round_of` visits its branches; `dist` composes its
    finished outputs with the distributions of the round states its cut runs lead to."""

    def __init__(self, runner: Callable, target: LM, eos: int | None, merge: bool, workers: int,
                 parallel_after_runs: int, progress: bool, deadline: _Deadline, count_calls: bool = False,
                 pool: Callable | None = None) -> None:
        """``runner(clock)`` makes the `PathRunner` (or `RemoteRunner`) that runs the sampler along paths."""
        self.eos, self.merge, self.parallel_after_runs = eos, merge, parallel_after_runs
        self.clock, self.deadline, self.count_calls = _Clock(), deadline, count_calls
        self.runner = runner(self.clock)
        self.patterns: dict[tuple, bool | None] = {}  # a round state's last-draw patterns -> confirmed by a run?
        self.vocab_size = target.vocab_size
        self.pool = Workers(workers, self.task) if pool is None else pool(workers, functools.partial(
            _Enumerator, runner, target, eos, merge, 1, parallel_after_runs, False, _Deadline(deadline.name, None)))
        self.rounds: dict[tuple[tuple[int, ...], int], _Round] = {}  # a round state's own runs
        self.table: dict[tuple[tuple[int, ...], int], dict] = {}  # a round state's composed distribution
        self.bar = progress_bar(desc="enumerating", unit="runs", enabled=progress, mininterval=1.0)
        self.runs = self.worker_calls = self.settled = 0

    def misses(self) -> int:
        return self.runner.misses()

    def model_calls(self) -> int:
        return self.misses() + self.worker_calls

    def note(self, name: str, wall: float) -> str:
        """Where the time went so far, and the usual cause of a slow enumeration if this one shows it."""
        split = self.clock.split(wall)
        where = f" (summed over {self.pool.n} workers and this process)" if self.pool.started else ""
        text = (f"{name}: {wall:.0f} s, {self.runs:,} sampler runs, {len(self.rounds):,} round states done; the "
                f"sampler's own code {split['sampler']:.1f} s, model calls {split['models']:.1f} s, the enumerator "
                f"{split['enumerator']:.1f} s{where}")
        part = max(split, key=split.get)
        if split[part] > 0:
            text += f"; the largest part: {_PARTS[part]} ({split[part] / sum(split.values()):.0%})"
        drafted = self.runner.drafted
        if drafted[0]:
            text += (f"; hint: a round drafted {drafted[0]} token(s) with {drafted[1]} left to emit "
                     f"(a draft or bonus past max_new_tokens is never emitted but multiplies the branches by up to "
                     f"V = {self.vocab_size}): draft at most max_new_tokens - len(out) - 1")
        return text

    def explore_branches(self, ctx: tuple[int, ...], budget: int, stack: list, after_run=None) -> _Round:
        """Run the branches on ``stack`` of the round started at (ctx, budget) and every branch they reach,
        ``runner.batch`` at a time; ``after_run(found, state, stack)`` is called after each run and may take the
        rest of the stack.  A runner in another process gets the next batch before this one settles the last, so
        the two processes work at once."""
        found = _Round()
        self.patterns = {}  # (last choice's depth, done, head, target calls, its weights) -> confirmed?
        overlap, pending = hasattr(self.runner, "start"), None
        while stack or pending:
            taken = [stack.pop() for _ in range(min(len(stack), self.runner.batch))]
            ticket = self.runner.start(ctx, budget, [t[0] for t in taken]) if overlap and taken else None
            if pending is not None:
                self.settle_batch(found, ctx, budget, *pending, stack, after_run)
            pending = (taken, ticket) if overlap and taken else None
            if not overlap:
                self.settle_batch(found, ctx, budget, taken, None, stack, after_run)
        return found

    def settle_batch(self, found: _Round, ctx: tuple[int, ...], budget: int, taken: list, ticket, stack: list,
                     after_run) -> None:
        results = self.runner.finish(ticket) if ticket is not None else self.runner.runs(ctx, budget,
                                                                                        [t[0] for t in taken])
        for (path, prob, confirm), r in zip(taken, results, strict=True):
            found.runs += 1
            self.settle(found, budget, path, prob, confirm, r.new, r.done, r.tokens, r.depth, r.calls, stack)
            if after_run is not None:
                after_run(found, (ctx, budget), stack)

    def settle(self, found: _Round, budget: int, path: list[int], prob: float, confirm, new: list, done: bool,
               tokens: tuple[int, ...], depth: int, calls: int, stack: list) -> None:
        """Record a run's outcome and push the alternatives of its round's new choices (its first ``depth``
        choices are the round's)."""
        if depth < len(path):
            raise AssertionError(f"the sampler made {depth} random choices when replayed along {len(path)}: its "
                                 "draws must depend only on the tokens and its rng (declare caps rng='own' otherwise)")
        mine = depth - len(path)  # the round's choices past the path
        if confirm is not None:
            _, was_done, head, was_calls, _ = confirm[0]
            self.confirmed(found, budget, path, confirm, mine == 0 and (done, tokens, calls) == (
                was_done, head + (path[-1],), was_calls), stack)
        last = new[mine - 1] if mine and self.merge else None
        if last is not None and last[2] and tokens and tokens[-1] == last[1] != self.eos and (
                not done or len(tokens) >= budget):
            prob = push_alternatives(stack, path, prob, new, mine - 1)
            taken = list(path) + [c for _, c, _ in new[: mine - 1]]
            self.last_draw(found, budget, taken, prob, last, (depth, done, tokens[:-1], calls), stack)
        else:
            self.record(found, budget, done, tokens, push_alternatives(stack, path, prob, new, mine), calls)

    def last_draw(self, found: _Round, budget: int, taken: list[int], prob: float, last: tuple, shape: tuple,
                  stack: list) -> None:
        """The round's last draw (a token row, after the choices ``taken``, at probability ``prob``) emitted
        its token: record this outcome, push a run of eos, and settle the others -- at once if this pattern
        (``shape``: the round's depth, done, the tokens before the draw, target calls; and the draw's weights)
        was confirmed, else after a run of a second outcome confirms it."""
        weights, chosen, _ = last
        depth, done, head, calls = shape
        eos = self.eos
        if eos is not None and eos != chosen and weights[eos] > 0:
            stack.append((taken + [eos], prob * weights[eos], None))
        self.record(found, budget, done, head + (chosen,), prob * weights[chosen], calls)
        pattern = (*shape, tuple(weights))
        agreed = self.patterns.get(pattern)
        if agreed:
            self.fold(found, budget, pattern, prob, agreed)
            return
        second = next((o for o, w in enumerate(weights) if w > 0 and o != chosen and o != eos), None)
        if second is None:
            return
        if agreed is False:  # the pattern failed before: every outcome is run
            stack.extend((taken + [o], prob * w, None) for o, w in enumerate(weights)
                         if w > 0 and o not in (chosen, eos))
            return
        self.patterns.setdefault(pattern, None)
        stack.append((taken + [second], prob * weights[second], (pattern, prob, (chosen, eos, second))))

    def confirmed(self, found: _Round, budget: int, path: list[int], confirm, agrees: bool, stack: list) -> None:
        """The run of a last draw's second outcome ended: settle the others as its pattern says if it agrees
        (and remember the outcomes the pattern's later draws settle: all but the run one and eos), else run them."""
        pattern, prob, skip = confirm
        if agrees:
            later = self.patterns[pattern] = settled_outcomes(pattern[4], skip[:2])
            now = later[0].copy()  # (V,)
            now[skip[2]] = 0.0  # this time the second outcome was run too
            self.fold(found, budget, pattern, prob, (now, later[1] - 1))
        else:
            self.patterns[pattern] = False
            stack.extend((path[:-1] + [o], prob * w, None) for o, w in enumerate(pattern[4]) if w > 0 and o not in skip)

    def fold(self, found: _Round, budget: int, pattern: tuple, prob: float, settled: tuple) -> None:
        """Settle a last draw's ``settled`` outcomes (their weights as a vector, and how many) without runs: a
        vector over the vocabulary per head, expanded once the round's runs are done."""
        _, done, head, calls, _ = pattern
        weights, count = settled
        rest = weights * prob  # (V,)
        self.settled += count
        if self.count_calls:
            found.calls[(len(head) + 1, calls)] += float(rest.sum())
        if len(head) >= budget:  # the drawn token lies past the budget: one outcome
            found.out[head[:budget]] += float(rest.sum())
            return
        key = (done or len(head) + 1 >= budget, head)
        into = found.groups.get(key)
        if into is None:
            found.groups[key] = rest
        else:
            into += rest  # a fold's own vector: no other entry holds it

    def record(self, found: _Round, budget: int, done: bool, tokens: tuple[int, ...], prob: float,
               calls: int) -> None:
        if done or len(tokens) >= budget:
            found.out[tokens[:budget]] += prob
        else:
            found.cut[tokens] += prob  # round one's tokens -> P(round one emits them)
        if self.count_calls:
            found.calls[(len(tokens), calls)] += prob

    def task(self, ctx: tuple[int, ...], budget: int, stack: list) -> tuple[_Round, int, _Clock, int]:
        """A worker's share: the whole subtree of the branches on ``stack``, the model calls it made, its
        clock and the outcomes it settled without runs."""
        before, settled, start = self.misses(), self.settled, time.perf_counter()
        self.clock.__init__()
        found = self.explore_branches(ctx, budget, stack)
        self.clock.busy = time.perf_counter() - start
        return found, self.misses() - before, self.clock, self.settled - settled

    def received(self, result: tuple[_Round, int, _Clock, int]) -> _Round:
        found, calls, clock, settled = result
        self.runs += found.runs
        self.worker_calls += calls
        self.clock.add(clock)
        self.settled += settled
        self.bar.update(found.runs)
        self.deadline.check(self)
        return found

    def after_run(self, found: _Round, state, stack: list) -> None:
        """Count the run; past ``parallel_after_runs``, give the pending branches to the workers."""
        self.runs += 1
        self.bar.update()
        if not self.runs & 255:
            self.deadline.check(self)
        if self.runs >= self.parallel_after_runs and stack and self.pool.start():
            pending = [(*state, [branch]) for branch in stack]  # the bottom of the stack, shallowest, first
            stack.clear()
            for result in self.pool.map(pending, self.clock):
                found.add(self.received(result))

    def round_of(self, ctx: tuple[int, ...], budget: int) -> _Round:
        if (ctx, budget) not in self.rounds:
            self.rounds[(ctx, budget)] = self.explore_branches(ctx, budget, [([], 1.0, None)], self.after_run)
        found = self.rounds[(ctx, budget)]
        found.expand()  # here, not in the workers: P(head + (o,)) travels as one vector per head
        return found

    def prefetch(self, states: list) -> None:
        """Explore ``states`` and every round state they lead to, one level at a time: in the workers, or each
        level's states together in the messages of a runner in another process (`explore_together`)."""
        rounds = self.rounds
        level = list(dict.fromkeys(s for s in states if s not in rounds))
        while level:
            level.sort(key=lambda s: -s[1])  # bigger budgets, bigger rounds: first
            tasks = [(ctx, budget, [([], 1.0, None)]) for ctx, budget in level]
            for state, result in zip(level, self.pool.map(tasks, self.clock, ordered=True) if self.pool.started
                                     else self.explore_together(level), strict=True):
                rounds[state] = self.received(result) if self.pool.started else result
                rounds[state].expand()
            level = list(dict.fromkeys((ctx + t, budget - len(t)) for ctx, budget in level
                                       for t in rounds[(ctx, budget)].cut if (ctx + t, budget - len(t)) not in rounds))

    def explore_together(self, states: list) -> list[_Round]:
        """`explore_branches` of several round states at once: each message to the runner carries the next batch
        of every state with branches left (up to ``MANY_PATHS`` paths), sent before the last one's runs settle."""
        work, inflight = {state: (_Round(), [([], 1.0, None)], {}) for state in states}, None  # runs, stack, patterns
        while True:
            groups, room = [], MANY_PATHS
            for state, (_, stack, _) in work.items():
                if stack and room > 0:
                    groups.append((state, [stack.pop() for _ in range(min(len(stack), self.runner.batch, room))]))
                    room -= len(groups[-1][1])
            ticket = self.runner.start_many([(*st, [t[0] for t in taken]) for st, taken in groups]) if groups else None
            for (state, taken), results in zip(*inflight, strict=True) if inflight else ():
                found, stack, self.patterns = work[state]
                for (path, prob, confirm), r in zip(taken, results, strict=True):
                    found.runs += 1
                    self.settle(found, state[1], path, prob, confirm, r.new, r.done, r.tokens, r.depth, r.calls,
                                stack)
                    self.after_run(found, state, stack)
            if not groups and inflight is None:
                return [found for found, _, _ in work.values()]
            inflight = (groups, self.runner.finish_many(ticket)) if groups else None

    def probe_budget(self, ctx: tuple[int, ...]) -> None:
        """One run from ``ctx`` with one token left: a sampler that drafts past its budget shows it here, at
        once, instead of in the last rounds of an enumeration whose first rounds may take minutes."""
        self.runner.probe(ctx)

    def dist(self, ctx: tuple[int, ...], budget: int) -> tuple[dict, dict]:
        """The distribution from round state (ctx, budget) as (outputs -> P, head -> P(head + (o,)) over o):
        composed with vector adds where a last draw's outcomes were settled together."""
        if (ctx, budget) in self.table:
            return self.table[(ctx, budget)]
        found = self.round_of(ctx, budget)
        out, groups = found.out, found.out_groups  # composed in place: a round's own outcomes are read only here
        if found.cut and (self.pool.started or hasattr(self.runner, "start_many")):
            self.prefetch([(ctx + t, budget - len(t)) for t in found.cut])
        # Composed once per distinct round outcome, not once per run: thousands of runs (the drafts a
        # rejection discards) end in the same tokens, and each would otherwise walk the whole sub-distribution.
        for tokens, prob in found.cut.items():
            tails, tail_groups = self.dist(ctx + tokens, budget - len(tokens))
            for tail, q in tails.items():
                out[tokens + tail] += prob * q
            for head, rest in tail_groups.items():
                key = tokens + head
                groups[key] = groups[key] + prob * rest if key in groups else prob * rest
        self.table[(ctx, budget)] = out, groups
        return out, groups

    def close(self) -> None:
        self.bar.close()
        self.pool.close()


class _Round:
    """What the runs of one round state found: outputs finished within the round, round one's tokens where a
    run was cut (to be composed with the distribution from there), and (tokens, target calls) of the round."""

    def __init__(self) -> None:
        self.out: dict[tuple[int, ...], float] = defaultdict(float)
        self.cut: dict[tuple[int, ...], float] = defaultdict(float)
        self.calls: dict[tuple[int, int], float] = defaultdict(float)
        self.groups: dict[tuple[bool, tuple[int, ...]], np.ndarray] = {}  # (finished, head) -> P(head + (o,)), (V,)
        self.out_groups: dict[tuple[int, ...], np.ndarray] = {}  # finished ones, once expanded
        self.runs = 0

    def expand(self) -> None:
        """Settled last draws: a cut one's outcomes become cuts of their own (each leads to its own round state),
        a finished one's stay one vector per head, composed as vectors."""
        for (finished, head), rest in self.groups.items():
            if finished:
                self.out_groups[head] = self.out_groups[head] + rest if head in self.out_groups else rest
            else:
                add_vector(self.cut, head, rest)
        self.groups.clear()

    def add(self, other: _Round) -> None:
        for mine, theirs in ((self.out, other.out), (self.cut, other.cut), (self.calls, other.calls)):
            for k, v in theirs.items():
                mine[k] += v
        for k, rest in other.groups.items():
            self.groups[k] = self.groups[k] + rest if k in self.groups else rest
        self.runs += other.runs


def first_round(
    sampler: Callable, target: LM, draft: LM | None, prompt: Sequence[int], *, gamma: int, budget: int,
    eos: int | None = None, deadline_s: float | None = None,
) -> dict[tuple[int, int], float]:
    """Exact distribution of (tokens emitted, target calls made) in the sampler's first round, its end read
    off the target calls as in `exact_distribution`."""

    runner = runner_of(sampler, target, draft, eos, True, True, dict(gamma=gamma, eos=eos))
    enumerator = _Enumerator(runner, target, eos, True, 1, PARALLEL_AFTER_RUNS, False,
                             _Deadline(getattr(sampler, "__qualname__", repr(sampler)), deadline_s), count_calls=True)
    found = enumerator.explore_branches(tuple(prompt), budget, [([], 1.0, None)], enumerator.after_run)
    return dict(found.calls)


def settled_outcomes(weights: tuple[float, ...], skip: tuple) -> tuple[np.ndarray, int]:
    """A last draw's weights (V,) with the outcomes in ``skip`` (run ones; None for none) at zero, and how
    many are left: what a fold of that draw settles, per unit of probability."""
    rest = np.array(weights)  # (V,)
    rest[[o for o in skip if o is not None]] = 0.0
    return rest, int(np.count_nonzero(rest))


def add_vector(into: dict, head: tuple[int, ...], rest: np.ndarray) -> None:
    """into[head + (o,)] += rest[o] for every o of non-zero probability."""
    tokens = np.flatnonzero(rest)
    keys = [head + (o,) for o in tokens.tolist()]
    if into.keys().isdisjoint(keys):  # the usual case, all new: one C loop (274,625 outputs in the goal case)
        into.update(zip(keys, rest[tokens].tolist(), strict=True))
        return
    for key, prob in zip(keys, rest[tokens].tolist(), strict=True):
        into[key] = into.get(key, 0.0) + prob


def expanded(out: dict, groups: dict) -> dict[tuple[int, ...], float]:
    """A distribution as one dict: the outputs and every head + (o,) of the groups."""
    result = dict(out)
    for head, rest in groups.items():
        add_vector(result, head, rest)
    return result


def max_difference(a: dict, b: dict) -> tuple[float, Hashable]:
    return max(((abs(a.get(k, 0.0) - b.get(k, 0.0)), k) for k in set(a) | set(b)), default=(0.0, ()))
