"""Running a sampler along scripted draws: what exact enumeration (harness/sampling/enumeration.py) asks of a sampler.

A run replays a path -- the outcomes of the sampler's first random choices -- then takes the first possible
outcome of every new choice and records it with its weights (`ReplayRng`).  The models the sampler calls are
memoized (a miss scores all V siblings of a prefix at once) and watched (`_Run`): the target call that starts
round two cuts the run there (`_Cut`), a round drafting past its budget stops the enumeration (`_PastBudget`).

`PathRunner` does the runs here, one path at a time.  `RemoteRunner` has them done in the implementation's own
process (harness/engine/boundary.py) in batches: that process runs the sampler and reports, per path, the choices
it made past the path with their weights, the tokens, and where its round ended; the enumerator -- the judge --
checks every report (each choice a distribution, the chosen outcome possible, the tokens in the vocabulary) and
computes every probability itself.  The models stay with the judge: a miss of the memo over there is a call back.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from llm_inference_harness.engine.tolerance import PROBABILITY_SUM
from llm_inference_harness.sampling.lm import LM, check_distribution, check_probability


class ReplayRng:
    """Follows `path`; at each new choice takes the first possible outcome and records the choice in `new`
    as (weights, chosen, token_row): the caller pushes the alternatives once the run has ended and
    it knows which choices were the round's.  A replayed choice is a list lookup: no tensor is read until
    the run goes past its recorded path.  ``eos`` is taken last among a token row's outcomes (a run that
    ends the document tells nothing about the others); ``vocab_size`` marks a row of token probabilities.
    """

    __slots__ = ("path", "depth", "new", "eos", "vocab_size", "seconds")

    def __init__(self, path: list[int], eos: int | None = None, vocab_size: int | None = None) -> None:
        self.path, self.depth, self.new = path, 0, []
        self.eos, self.vocab_size = eos, vocab_size
        self.seconds = 0.0  # spent in this rng's draws: the enumerator's share of a run

    def _choose(self, weights: list[float], token_row: bool) -> int:
        """A choice past the recorded path: take the first possible outcome, record the choice (its other
        outcomes are listed only if the run turns out to own it: a round-two draw is never branched)."""
        chosen = next(i for i, w in enumerate(weights) if w > 0)
        if token_row and chosen == self.eos:
            chosen = next((i for i, w in enumerate(weights) if w > 0 and i != chosen), chosen)
        self.new.append((weights, chosen, token_row))
        self.depth += 1
        return chosen

    def categorical(self, probs: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        depth = self.depth
        if probs.dim() == 1:
            if depth < len(self.path):
                self.depth = depth + 1
                token = self.path[depth]
            else:
                weights = probs.tolist()
                if not (min(weights, default=-1.0) >= 0 and abs(sum(weights) - 1) <= PROBABILITY_SUM):
                    check_distribution(probs, "rng.categorical")  # raises, naming what is wrong
                token = self._choose(weights, len(weights) == self.vocab_size)
            self.seconds += time.perf_counter() - start
            return _scalar(token)
        if depth >= len(self.path):
            check_distribution(probs, "rng.categorical")
        rows = probs.reshape(-1, probs.shape[-1])  # (rows, V)
        token_row = len(rows) == 1 and rows.shape[1] == self.vocab_size
        tokens = torch.tensor([self._next(r.tolist(), token_row) for r in rows]).reshape(probs.shape[:-1])
        self.seconds += time.perf_counter() - start
        return tokens

    def bernoulli(self, probs) -> torch.Tensor:
        start = time.perf_counter()
        depth = self.depth
        one = type(probs) is float or isinstance(probs, torch.Tensor) and probs.dim() == 0
        if one and depth < len(self.path):
            self.depth = depth + 1
            self.seconds += time.perf_counter() - start
            return _BOOLS[self.path[depth]]
        if type(probs) is float and 0.0 <= probs <= 1.0:  # one acceptance test, without tensor checks
            pick = self._choose([1.0 - probs, probs], False)
            self.seconds += time.perf_counter() - start
            return _BOOLS[pick]
        probs = torch.as_tensor(probs, dtype=torch.float64)
        if depth >= len(self.path):
            check_probability(probs, "rng.bernoulli")
        picks = [bool(self._next((1.0 - x, x), False)) for x in probs.reshape(-1).tolist()]
        self.seconds += time.perf_counter() - start
        return _BOOLS[picks[0]] if probs.dim() == 0 else torch.tensor(picks).reshape(probs.shape)

    def _next(self, weights, token_row: bool) -> int:
        depth = self.depth
        if depth < len(self.path):
            self.depth = depth + 1
            return self.path[depth]
        return self._choose(list(weights), token_row)


def push_alternatives(stack: list, path: list[int], prob: float, new: list, upto: int) -> float:
    """Push the alternatives of the first ``upto`` new choices of a run along ``path`` (probability ``prob``
    so far); return the probability of the run's own choices."""
    taken = list(path)
    for weights, chosen, _ in new[:upto]:
        stack.extend((taken + [o], prob * w, None) for o, w in enumerate(weights) if w > 0 and o != chosen)
        taken.append(chosen)
        prob *= weights[chosen]
    return prob


def explore(run: Callable[[ReplayRng], Hashable], bar=None) -> Iterator[tuple[Hashable, float]]:
    """Yield (outcome, probability) for every branch of ``run``; the probabilities sum to one."""
    stack: list = [([], 1.0, None)]
    while stack:
        path, prob, _ = stack.pop()
        rng = ReplayRng(path)
        outcome = run(rng)
        prob = push_alternatives(stack, path, prob, rng.new, len(rng.new))
        if bar is not None:
            bar.update()
        yield outcome, prob


def explore_batches(run_many: Callable[[list[list[int]]], list], batch: int = 512) -> Iterator[tuple[Hashable, float]]:
    """`explore` with ``run_many(paths) -> [(outcome, its new choices), ...]`` running up to ``batch`` paths at once
    (a sampler in its own process: one message each); the same branches, visited in another order."""
    stack: list = [([], 1.0, None)]
    while stack:
        taken = [stack.pop() for _ in range(min(len(stack), batch))]
        for (path, prob, _), (outcome, new) in zip(taken, run_many([t[0] for t in taken]), strict=True):
            yield outcome, push_alternatives(stack, path, prob, new, len(new))


# Replays return shared 0-dim tensors: creating a fresh one costs more than the rest of a choice.
_BOOLS = (torch.tensor(False), torch.tensor(True))
_SCALARS: list[torch.Tensor] = []


def _scalar(i: int) -> torch.Tensor:
    while len(_SCALARS) <= i:
        _SCALARS.append(torch.tensor(len(_SCALARS)))
    return _SCALARS[i]



class _Cut(BaseException):  # BaseException: a sampler's `except Exception` must not swallow it
    """Raised at the target call that starts round two: round one emitted ``emitted``; its choices are the
    first ``depth``, its target calls ``calls``."""

    def __init__(self, emitted: tuple[int, ...], depth: int, calls: int) -> None:
        self.emitted, self.depth, self.calls = emitted, depth, calls


class _PastBudget(BaseException):  # BaseException: a sampler's `except Exception` must not swallow it
    """Raised at a round's target call that verifies more drafts than the round may emit (any round of the run)."""

    def __init__(self, drafted: int, budget: int) -> None:
        self.drafted, self.budget = drafted, budget


class _Run:
    """The watch on the current run: target calls, and where each prefix was last called after the first
    target call (the choices made by then, the target calls made by then)."""

    __slots__ = ("prompt", "cut", "rng", "target_calls", "seen", "drafted", "budget_rule")

    def __init__(self, budget_rule: bool = True) -> None:
        self.drafted = (0, 0)  # (k, budget) of the round that drafted the furthest past its budget (k >= budget)
        self.budget_rule = budget_rule  # a round drafting past its budget stops the enumeration (_PastBudget)

    def start(self, prompt: tuple[int, ...], cut: bool, rng: ReplayRng) -> None:
        self.prompt, self.cut, self.rng, self.target_calls, self.seen = prompt, cut, rng, 0, {}

    def watch(self, xs: list[tuple[int, ...]], n: int, is_target: bool, budget: int) -> None:
        """One model call on prefixes ``xs``; raises `_Cut` at a round boundary, `_PastBudget` at a target call that
        verifies a draft past the run's budget."""
        calls = self.target_calls
        if is_target:
            self.against_budget(xs, n, calls, budget)
        if calls:
            depth = self.rng.depth
            for x in xs:
                self.seen[x] = (depth, calls)
            if is_target and self.cut:
                self.boundary(xs, n)
        if is_target:
            self.target_calls = calls + 1

    def against_budget(self, xs: list[tuple[int, ...]], n: int, calls: int, budget: int) -> None:
        """Every target call, each round's, not only the run's first: its longest prefix holds the tokens emitted
        before the round and the round's drafts, so a prefix more than ``budget`` tokens past the run's prompt
        verifies a draft that can never be emitted (k > tokens left).  The first call's drafts are all of them (it
        may score more positions, as a KV cache filling on the prompt does); a later one's, its last n - 1 tokens
        (``target([prompt + out + drafts], n=k + 1)``).  Without this, the rounds after the first of a run played
        out whole (run by run: ``merge=False``, a sampler that declares markov=False) went unchecked."""
        past = max(len(x) for x in xs) - len(self.prompt)  # tokens emitted before the round + its drafts
        k = past if not calls else max(min(n - 1, past), past - budget)  # the drafts: k > left iff past > budget
        left = budget - (past - k)  # the tokens the round may still emit
        if k > left and self.budget_rule:
            raise _PastBudget(k, left)
        if k >= left and k - left >= self.drafted[0] - self.drafted[1]:
            self.drafted = (k, left)

    def boundary(self, xs: list[tuple[int, ...]], n: int) -> None:
        """A target call after the first: its prefixes' common head (all but the last n - 1 tokens) names
        the tokens round one emitted, if round two started with a call on exactly that head."""
        heads = {x[: len(x) - n + 1] for x in xs}
        if len(heads) != 1:
            return
        head, P = heads.pop(), len(self.prompt)
        if len(head) > P and head[:P] == self.prompt:
            start = self.seen.get(head)  # round two's first call, on prompt + e
            if start is not None and start[0] >= len(self.rng.path):
                raise _Cut(head[P:], *start)


class _Model:
    """A model as the enumerated sampler sees it: memoized, and watched for the start of round two.

    Each (prefix, n) reaches the model once.  A miss scores the prefix together with its siblings (the
    same prefix ending in every other token) in one batched call: the enumeration visits every possible
    token there, and one call over V rows costs about as much as one over a single row.
    """

    def __init__(self, lm: LM, run: _Run, is_target: bool, clock: _Clock) -> None:
        self.lm, self.vocab_size, self.run, self.is_target, self.clock = lm, lm.vocab_size, run, is_target, clock
        self.cache: dict[tuple[tuple[int, ...], int], torch.Tensor] = {}
        self.misses = 0
        self.budget = 0  # of the round state being explored

    def __call__(self, prefixes, n=1):
        start = time.perf_counter()
        if len(prefixes) == 1:  # the common case, without building a list
            key = (tuple(prefixes[0]), n)
            self.run.watch([key[0]], n, self.is_target, self.budget)
            row = self.cache.get(key)
            if row is None:
                self._fill(key[0], n)
                row = self.cache[key]
            self.clock.lookups += time.perf_counter() - start
            return row  # (1, n, V)
        xs = [tuple(x) for x in prefixes]
        self.run.watch(xs, n, self.is_target, self.budget)
        rows = []
        for x in xs:
            if (x, n) not in self.cache:
                self._fill(x, n)
            rows.append(self.cache[(x, n)])
        self.clock.lookups += time.perf_counter() - start
        return torch.cat(rows)  # (B, n, V)

    def _fill(self, x: tuple[int, ...], n: int) -> None:
        start = time.perf_counter()
        siblings = [x[:-1] + (v,) for v in range(self.vocab_size)]
        missing = [s for s in siblings if (s, n) not in self.cache]
        self.misses += 1
        scored = self.lm([list(s) for s in missing], n)  # (len(missing), n, V)
        rows = [scored[i : i + 1] for i in range(len(missing))]  # (1, n, V) each
        if _distributions(scored, self.vocab_size):  # checked here at once, not row by row by `validated`
            for row in rows:
                row.checked_distribution = True
        self.cache.update(zip(((s, n) for s in missing), rows, strict=True))
        self.clock.models += time.perf_counter() - start


def _distributions(p, vocab_size: int) -> bool:
    """Whether every row of p (B, n, V) is a distribution over vocab_size ids (a sampler's `validated` then
    skips its own check of each row, which costs more than the whole batch's here)."""
    if not (isinstance(p, torch.Tensor) and p.dtype == torch.float64 and p.device.type == "cpu" and p.dim() == 3
            and p.shape[-1] == vocab_size and p.numel() and not p.requires_grad):
        return False
    a = p.numpy()
    return bool(a.min() >= 0 and np.abs(a.sum(-1) - 1).max() <= PROBABILITY_SUM)



@dataclass
class _Clock:
    """Where an enumeration's time goes: inside the models (misses), in the sampler's code (its runs less
    the draws and memo lookups made for it) and in the enumerator (the rest of the busy time: draws,
    lookups, bookkeeping, composition); summed over the processes, waiting on workers left out."""

    models: float = 0.0
    lookups: float = 0.0  # memo lookups, misses included (models is subtracted)
    draws: float = 0.0
    runs: float = 0.0  # inside sampler calls, all included
    busy: float = 0.0  # a worker's time on its tasks
    waiting: float = 0.0  # the parent's time waiting on workers

    def add(self, other: _Clock) -> None:
        self.models += other.models
        self.lookups += other.lookups
        self.draws += other.draws
        self.runs += other.runs
        self.busy += other.busy

    def split(self, wall: float) -> dict[str, float]:
        """Seconds of the sampler's own code, of model calls and of the enumerator, in an enumeration that
        has run ``wall`` seconds in this process."""
        sampler = max(0.0, self.runs - self.lookups - self.draws)
        return {"sampler": sampler, "models": self.models,
                "enumerator": max(0.0, wall - self.waiting + self.busy - sampler - self.models)}



class DraftsPastBudget(AssertionError):
    """A round drafted more tokens than it may emit: the contract's budget rule (harness/contracts/speculative.py)."""


def past_budget(drafted: int, budget: int, vocab_size: int) -> DraftsPastBudget:
    return DraftsPastBudget(
        f"breaks the contract's budget rule: a round drafted {drafted} token(s) with {budget} left to emit "
        f"(max_new_tokens - len(out)).  A draft past the budget is never emitted, costs a draft call, and "
        f"multiplies the branches to enumerate by up to V = {vocab_size} (minutes on the tiny models): draft "
        f"k = min(gamma, max_new_tokens - len(out) - 1) tokens, leaving room for the bonus token")


def tokens_of(generation) -> list[int]:
    return list(getattr(generation, "tokens", generation))



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



@dataclass
class RunResult:
    """One run: finished (``done``) or cut at round two; the round's tokens, its choices (its first ``depth``),
    its target calls, and every choice past the path as (weights, chosen, token_row)."""

    done: bool
    tokens: tuple[int, ...]
    depth: int
    calls: int
    new: list


class PathRunner:
    """Runs the sampler here, one path at a time (``batch = 1``: the enumeration's order is depth first)."""

    batch = 1

    def __init__(self, call: Callable, target: LM, draft: LM | None, eos: int | None, merge: bool,
                 budget_rule: bool, clock: _Clock) -> None:
        self.call, self.eos, self.merge, self.clock = call, eos, merge, clock
        self.run = _Run(budget_rule)
        self.target = _Model(target, self.run, True, clock)
        self.draft = _Model(draft, self.run, False, clock) if draft is not None else None
        self.vocab_size = target.vocab_size

    def misses(self) -> int:
        return self.target.misses + (self.draft.misses if self.draft else 0)

    @property
    def drafted(self) -> tuple[int, int]:
        return self.run.drafted

    def set_budget(self, budget: int) -> None:
        self.target.budget = budget
        if self.draft is not None:
            self.draft.budget = budget

    def runs(self, ctx: tuple[int, ...], budget: int, paths: list[list[int]]) -> list[RunResult]:
        self.set_budget(budget)
        return [self.one(ctx, budget, path) for path in paths]

    def one(self, ctx: tuple[int, ...], budget: int, path: list[int]) -> RunResult:
        run, V = self.run, self.vocab_size
        rng = ReplayRng(path, self.eos, V)
        run.start(ctx, self.merge, rng)
        given = list(ctx)
        start = time.perf_counter()
        try:
            out = self.call(self.target, self.draft, given, budget, rng)
            done, depth, calls = True, rng.depth, run.target_calls
            tokens = check_output(tokens_of(out), budget, V, given, ctx)
        except _Cut as cut:
            done, tokens, depth, calls = False, cut.emitted, cut.depth, cut.calls
            check_output([], budget, V, given, ctx)
        except _PastBudget as past:
            raise past_budget(past.drafted, past.budget, V) from None
        self.clock.runs += time.perf_counter() - start
        self.clock.draws += rng.seconds
        return RunResult(done, tokens, depth, calls, rng.new)

    def probe(self, ctx: tuple[int, ...]) -> None:
        """One run from ``ctx`` with one token left: a sampler that drafts past its budget shows it here."""
        rng = ReplayRng([], self.eos, self.vocab_size)
        self.run.start(ctx, False, rng)
        self.set_budget(1)
        try:
            self.call(self.target, self.draft, list(ctx), 1, rng)
        except _PastBudget as past:
            raise past_budget(past.drafted, past.budget, self.vocab_size) from None
        except Exception:  # noqa: BLE001 - a probe only: the enumeration proper reports what the sampler raises
            pass
        self.run.drafted = (0, 0)  # the hint in slow notes is about the enumeration's own rounds


# --- in the implementation's process ----------------------------------------------------------------------------
_SESSION: dict = {}  # the enumeration this process is serving: its id and runner (memos kept across batches)


def run_paths(server, session: int, setup: dict | None, ctx: list, budget: int, paths: list, probe: bool) -> list:
    """The implementation's side of `RemoteRunner`: the runs of a batch of paths, as builtins, until one raises."""
    from llm_inference_harness.engine import wire

    if setup is not None:
        sampler, decode = server.objects[setup["handle"]], server.decoder.decode
        target, draft = decode(setup["target"]), decode(setup["draft"])
        kwargs = decode(setup["kwargs"])

        def call(t, d, given, b, rng):
            return sampler(t, d, given, max_new_tokens=b, rng=rng, **kwargs)

        _SESSION.clear()
        _SESSION.update(id=session, runner=PathRunner(call, target, draft, setup["eos"], setup["merge"],
                                                      setup["budget_rule"], _Clock()))
    if _SESSION.get("id") != session:
        return [("raised", wire.encode_exception(RuntimeError("no such enumeration session")))]
    runner, ctx = _SESSION["runner"], tuple(ctx)
    if probe:
        try:
            runner.probe(ctx)
        except DraftsPastBudget as exc:
            return [("raised", wire.encode_exception(exc))]
        return []
    out = []
    runner.set_budget(budget)
    for path in paths:
        try:
            r = runner.one(ctx, budget, path)
        except BaseException as exc:  # noqa: BLE001 - the judge raises it (a _Cut never escapes `one`)
            out.append(("raised", wire.encode_exception(exc)))
            break
        out.append(("run", r.done, list(r.tokens), r.depth, r.calls,
                    [(list(map(float, w)), c, t) for w, c, t in r.new]))
    out.append(("drafted", list(runner.run.drafted), runner.misses()))
    return out


def run_paths_many(server, session: int, setup: dict | None, groups: list) -> list:
    """`run_paths` of several round states, ``groups`` of (ctx, budget, paths): each one's report, until one
    raises."""
    out = []
    for ctx, budget, paths in groups:
        out.append(run_paths(server, session, setup, ctx, budget, paths, False))
        setup = None
        if any(entry[0] == "raised" for entry in out[-1]):
            break
    return out


def well_formed(choices: list) -> bool:
    """Each (weights, chosen, token_row): float weights >= 0 summing to one, the chosen outcome possible (checked
    a vector length at a time, one array each)."""
    by_length: dict[int, list] = {}
    for choice in choices:
        weights, chosen, token_row = choice
        if type(weights) is not list or not weights or set(map(type, weights)) != {float} or not (
                type(chosen) is int and 0 <= chosen < len(weights)) or type(token_row) is not bool:
            return False
        by_length.setdefault(len(weights), []).append((weights, chosen))
    for group in by_length.values():
        w = np.array([weights for weights, _ in group], dtype=np.float64)
        picked = w[np.arange(len(group)), [chosen for _, chosen in group]]
        if not ((w >= 0).all() and (picked > 0).all() and (np.abs(w.sum(axis=1) - 1) <= PROBABILITY_SUM).all()):
            return False
    return True


# --- in the judge ------------------------------------------------------------------------------------------------
class RemoteRunner:
    """Runs the sampler in the implementation's process, ``batch`` paths a message; checks every report."""

    batch = 512
    _sessions = itertools.count(1)

    def __init__(self, sampler, target: LM, draft: LM | None, eos: int | None, merge: bool, budget_rule: bool,
                 kwargs: dict) -> None:
        from llm_inference_harness.engine import wire

        self.process, self.session = sampler.process, next(self._sessions)
        # a table model by value, kept over there (`wire.Encoder`'s ``sent``): its rows cost the runs no round trip
        encoder = wire.Encoder(self.process.handle_of, None, sent=self.process.sent)
        self.setup = {"handle": sampler.handle, "target": encoder.encode(target), "draft": encoder.encode(draft),
                      "kwargs": encoder.encode(kwargs), "eos": eos, "merge": merge, "budget_rule": budget_rule}
        self.vocab_size, self.eos = target.vocab_size, eos
        self.drafted, self._misses = (0, 0), 0

    def misses(self) -> int:
        return self._misses

    def runs(self, ctx: tuple[int, ...], budget: int, paths: list[list[int]]) -> list[RunResult]:
        return self.finish(self.start(ctx, budget, paths))

    def start(self, ctx: tuple[int, ...], budget: int, paths: list[list[int]]) -> tuple:
        """Send a batch; `finish` collects its runs (meanwhile the judge may settle the batch before)."""
        setup, self.setup = self.setup, None
        return self.process.post(("paths", self.session, setup, list(ctx), budget, paths, False)), paths

    def finish(self, ticket: tuple) -> list[RunResult]:
        rid, paths = ticket
        entries = self._entries(self.process.wait(rid, self._limit(paths)), paths, probe=False)
        results = [self._checked(e, path) for e, path in zip(entries, paths, strict=False)]
        self._distributions([c for r in results for c in r.new])
        return results

    def start_many(self, groups: list[tuple[tuple[int, ...], int, list[list[int]]]]) -> tuple:
        """Send the next batch of several round states, ``groups`` of (ctx, budget, paths), in one message."""
        setup, self.setup = self.setup, None
        groups = [(list(ctx), budget, paths) for ctx, budget, paths in groups]
        return self.process.post(("paths_many", self.session, setup, groups)), groups

    def finish_many(self, ticket: tuple) -> list[list[RunResult]]:
        """Each group's runs, checked as `finish` checks them."""
        rid, groups = ticket
        reply = self.process.wait(rid, self._limit([p for _, _, paths in groups for p in paths]))
        reports = reply.value if reply.kind == "paths" else None
        if type(reports) is not list or len(reports) > len(groups):
            raise self.process.crash("crashed: the implementation's process answered an enumeration batch with "
                                     "something else")
        results = []
        for report, (_, _, paths) in zip(reports, groups, strict=False):
            entries = self._report(report, paths, probe=False)
            results.append([self._checked(e, path) for e, path in zip(entries, paths, strict=False)])
        if len(results) != len(groups):
            raise self.process.crash("crashed: an enumeration report of the wrong length")
        self._distributions([c for runs in results for r in runs for c in r.new])
        return results

    def probe(self, ctx: tuple[int, ...]) -> None:
        setup, self.setup = self.setup, None
        rid = self.process.post(("paths", self.session, setup, list(ctx), 1, [], True))
        self._entries(self.process.wait(rid, self._limit([])), [], probe=True)

    def _limit(self, paths: list) -> float:
        return self.process.call_limit_s * max(1, len(paths) // 64) + 3.0

    def _entries(self, reply, paths: list, probe: bool) -> list:
        return self._report(reply.value if reply.kind == "paths" else None, paths, probe)

    def _report(self, entries, paths: list, probe: bool) -> list:
        from llm_inference_harness.engine import wire

        if type(entries) is not list:
            raise self.process.crash("crashed: the implementation's process answered an enumeration batch with "
                                     "something else")
        raised = None
        try:
            if entries and entries[-1][0] == "drafted":
                *entries, (_, drafted, misses) = entries
                self.drafted, self._misses = (int(drafted[0]), int(drafted[1])), int(misses)
            if entries and entries[-1][0] == "raised":
                raised = wire.decode_exception(entries[-1][1])
        except (TypeError, ValueError, IndexError, wire.Malformed) as exc:
            raise self.process.crash(f"crashed: a malformed enumeration report ({exc})") from None
        if raised is not None:  # what the sampler raised in a run: the enumeration stops with it, as here
            raise raised
        if not probe and len(entries) != len(paths):
            raise self.process.crash("crashed: an enumeration report of the wrong length")
        return entries

    def _checked(self, entry, path: list[int]) -> RunResult:
        """A run's report, taken only if it is well formed: every choice a distribution with its outcome possible,
        the tokens in the vocabulary, the round's choices within what it reported."""
        try:
            tag, done, tokens, depth, calls, new = entry
            if tag != "run" or type(done) is not bool or type(depth) is not int or type(calls) is not int:
                raise ValueError("a run's fields")
            if type(tokens) is not list or (tokens and (set(map(type, tokens)) != {int} or min(tokens) < 0
                                                        or max(tokens) >= self.vocab_size)):
                raise ValueError(f"tokens {tokens!r:.80} outside the vocabulary")
            choices = []
            for weights, chosen, token_row in new:  # checked by `_distributions`, over the batch at once
                choices.append((weights, chosen, token_row))
            if not len(path) <= depth <= len(path) + len(choices) or calls < 0:
                raise ValueError("a round's depth outside the choices it made")
        except (TypeError, ValueError) as exc:
            raise self.process.crash(f"crashed: the implementation's process sent a malformed run ({exc})") from None
        return RunResult(done, tuple(tokens), depth, calls, choices)

    def _distributions(self, choices: list) -> None:
        """Every choice of a batch's runs a draw from a distribution (`well_formed`)."""
        if not well_formed(choices):
            raise self.process.crash("crashed: the implementation's process sent a malformed run (a choice that is "
                                     "not a draw from a distribution)")
