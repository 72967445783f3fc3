"""The steps of a block-manager program (contract: harness/contracts/block_manager.py), each with the laws of its call.

`BlockManagerSteps` keeps a small shadow model -- each live sequence's tokens, which are swapped out (in swap-out
order), which were preempted by recompute and which freed -- and makes one call per step, checking what that call
alone decides: an OutOfBlocks only when the free blocks cannot cover the request, allocate computing exactly the
tokens it did not find cached, and every observable unchanged by a call that raises.  The state machine
(properties/block_manager_machine.py) draws the steps; pinned programs (properties/test_block_manager.py, PINNED)
name them.  `SITUATIONS` are the states where bookkeeping bugs live, counted with `event()`.
"""

import functools
from collections.abc import Callable

from hypothesis import event
from hypothesis.control import currently_in_test_context

from llm_inference_harness.contracts.block_manager import (
    OutOfBlocks,
    ahead,
    expect,
    guarded_batch,
    open_manager,
    prefetch,
)
from llm_inference_harness.engine.guard import names_argument
from llm_inference_harness.engine.registry import Impl
from llm_inference_harness.strategies.block_manager import PoolGeometry
from llm_inference_harness.strategies.block_manager_shadow import Prefixes, ShadowStorage

# The situations where bookkeeping bugs live, each with the fraction of the ci profile's programs that must reach it
# (both machines run the same programs): tests/test_block_manager_reach.py checks these floors on both correct
# managers on the programs of four seeds pooled; properties/block_manager_machine.py gives the fractions measured.
SITUATIONS = {
    "OutOfBlocks: allocate": 0.2,
    "OutOfBlocks: append": 0.2,
    "OutOfBlocks: swap_out": 0.2,
    "OutOfBlocks: swap_in": 0.2,
    "OutOfBlocks: swap_in with some blocks free": 0.2,
    "copy-on-write of a shared last block": 0.2,
    "preemption: a sequence resumed by recompute": 0.2,
    "prefix: two or more cached blocks, then the prompt diverges": 0.2,
    "prefix: a cached block evicted": 0.2,
    "prefix: a cached prefix reused after another was evicted": 0.2,
    "prefix: an evicted prefix computed again": 0.2,
    "prefix: the next block and the one before it cached under another history": 0.2,
    "swap: a multi-block swap": 0.2,
    "swap: several sequences swapped out at once": 0.2,
    "swap: swapped back in out of order": 0.2,
    "swap: CPU blocks freed and used again": 0.2,
    "swap: a CPU table out of block-id order": 0.2,
    "swap: after swap_in and fork, the parent writes the shared last block first": 0.2,
    "rejected: a call raises while sequences are live": 0.2,
}


def situation(name: str, seen: set[str] | None = None) -> None:
    """Count a situation where bookkeeping bugs live (`--hypothesis-show-statistics`), and add it to ``seen`` (the
    run's `target`); pinned programs run outside Hypothesis and count nothing."""
    assert name in SITUATIONS, f"situation {name!r} is not in SITUATIONS"
    if currently_in_test_context():
        event(name)
    if seen is not None:
        seen.add(name)


def step(fn):
    """A rule or invariant, its manager calls under one guard (`guarded_batch`), that marks the run failed when it
    raises: Hypothesis runs teardown() in a finally, and teardown's own checks would replace the first failure's
    message."""

    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        try:
            return guarded_batch(self.impl, lambda: fn(self, *args, **kwargs))
        except BaseException:
            self.failed = True
            raise

    return run


class BlockManagerSteps:
    """A manager under test and its shadow; ``checks`` names the laws checked ("bookkeeping", "data")."""

    impl: Impl
    checks: frozenset[str] = frozenset()
    failed = False  # a step or invariant raised: teardown checks nothing

    def open(self, geometry: PoolGeometry) -> None:
        self.g, self.B = geometry, geometry.block_size
        self.prefixes = Prefixes()
        self.kv: dict[int, list[int]] = {}  # live sequence -> prefix ids of its tokens, grown lazily
        self.storage = ShadowStorage(geometry, lambda sid, pos: self.kv_ids(sid)[pos])
        self.m = open_manager(self.impl, geometry.num_blocks, self.B, self.storage,
                              num_cpu_blocks=geometry.num_cpu_blocks, timed=False)
        self.storage.ref_count = self.m.ref_count if "data" in self.checks else (lambda block: 0)
        # every step reads counts (the invariants all of them): asked with every change until the invariants' own
        # prefetches replace these, so the initialize rule's scheduler iterations find them too
        prefetch(self.m, [("ref_count", (b,)) for b in range(geometry.num_blocks)] + [("num_free_blocks", ()),
                                                                                     ("num_free_cpu_blocks", ())])
        self.shadow: dict[int, list[int]] = {}  # live sequence -> its tokens
        self.swapped: list[int] = []  # in swap-out order
        self.preempted: dict[int, list[int]] = {}  # preempted by recompute -> tokens to recompute
        self.dead: set[int] = set()  # freed sequences: their ids are unknown to the manager now
        self.history: list[list[int]] = []
        self.given: list[tuple[list[int], tuple[int, ...]]] = []  # lists handed to the manager, as handed
        self.accepted: list[tuple] = []  # (method, args, result, storage calls) of every call that succeeded
        self.raised: list[str] = []  # calls that raised (rejected, or OutOfBlocks), for the replay's message
        self.evicted: set[int] = set()  # prefix ids of cached blocks seen evicted
        self.unread_flags: tuple = ([], None)  # (sid, swapped, tokens) of each live sequence, is_swapped and
                                               # num_tokens asked of the state after the latest step (`ahead`)
        self.unread_evictions: tuple = ([], None)  # prefix ids that may have been evicted, their lookups (`ahead`)
        self.cpu_used: set[int] = set()  # CPU blocks some swap_out has used
        self.swapped_in: set[int] = set()
        self.seen: set[str] = set()  # situations reached: the score `target` raises
        self.next_id = 0

    def situation(self, name: str) -> None:
        situation(name, self.seen)

    # ---- the shadow
    def kv_ids(self, sid) -> list[int]:
        tokens, ids = self.shadow[sid], self.kv.setdefault(sid, [])
        del ids[len(tokens):]
        while len(ids) < len(tokens):
            ids.append(self.prefixes.child(ids[-1] if ids else -1, tokens[len(ids)]))
        return ids

    def resident(self) -> list[int]:
        return sorted(set(self.shadow) - set(self.swapped))

    def partial(self, sids) -> list[int]:
        return [s for s in sids if len(self.shadow[s]) % self.B]

    def sources(self) -> list[list[int]]:
        """What prompts derive from: the 8 most recent prompts and the tokens of 8 live sequences (grown by
        appends, copied by forks), so blocks duplicated by appends, hash chains through appended blocks and a
        fork's diverged tails are looked up again.  A bounded choice keeps shrinking a failing program cheap
        (the stale-count mutant's kill took 29 s -> 10 s of CPU)."""
        return self.history[-8:] + [list(self.shadow[s]) for s in sorted(self.shadow)[-8:]]

    def earlier(self) -> list[tuple[int, ...]]:
        """The distinct prompts and live sequences' tokens the sources hold, the latest last."""
        return list(dict.fromkeys(tuple(p) for p in self.sources()))

    def unknown_ids(self) -> list[int]:
        return sorted(self.dead | set(self.preempted)) or [self.next_id + 1000]

    def fit_on_cpu(self) -> list[int]:
        """The shortest resident sequences, as many as fit in the free CPU blocks together."""
        fit, room = [], self.m.num_free_cpu_blocks()
        for sid in sorted(self.resident(), key=lambda s: len(self.m.block_table(s))):
            if len(self.m.block_table(sid)) > room:
                break
            fit.append(sid)
            room -= len(self.m.block_table(sid))
        return fit

    # ---- calls
    def hand(self, tokens) -> list[int]:
        """A fresh list for the manager, remembered: a manager that keeps it and appends to it (aliasing the
        caller's prompt) shows up in the bookkeeping invariant."""
        self.given.append((mine := list(tokens), tuple(tokens)))
        return mine

    def call(self, method, *args):
        """A call that must succeed, recorded with its storage calls for the replay.  The storage reads the count of
        each block written (`ShadowStorage`): a manager in the implementation's process brings every block's count
        of a small pool back with the call (a machine's pools hold at most 12 blocks; ~700 messages a ci run)."""
        start = len(self.storage.trace)
        if "data" in self.checks and self.g.num_blocks <= 64:
            expect(self.m, [("ref_count", (b,)) for b in range(self.g.num_blocks)])
        out = getattr(self.m, method)(*args)
        if "bookkeeping" in self.checks:
            kept = tuple(list(a) if isinstance(a, list) else a for a in args)
            self.accepted.append((method, kept, out, tuple(self.storage.trace[start:])))
        return out

    def observe(self) -> dict:
        """What a call that raises must leave as it was: the block tables, the reference counts, the free counts,
        the cache as lookups of the 8 latest distinct earlier prompts see it, the storage calls made so far.
        (The token counts and is_swapped follow the shadow, which such a call leaves alone: the invariants
        check those after the step; the replay at teardown, what the calls after it do.)"""
        return self.observed_ahead()()

    def observed_ahead(self) -> Callable[[], dict]:
        """`observe` of this state, its answers read when the returned function is called (`ahead`: a manager in
        the implementation's process sends the queries it does not know yet with the next change)."""
        tables, earlier, storage_calls = sorted(self.shadow), self.earlier()[-8:], len(self.storage.trace)
        asked = ahead(self.m, [("block_table", (s,)) for s in tables] + [("ref_count", (b,)) for b in range(
            self.g.num_blocks)] + [("num_free_blocks", ()), ("num_free_cpu_blocks", ())] + [
            ("lookup_prefix", (list(p),)) for p in earlier])

        def observation() -> dict:
            answers = iter(asked.values())
            return {
                "block tables": {s: next(answers) for s in tables},
                "reference counts": [next(answers) for _ in range(self.g.num_blocks)],
                "free blocks (GPU, CPU)": (next(answers), next(answers)),
                "lookup_prefix of earlier prompts": {p: next(answers) for p in earlier},
                "storage calls": storage_calls,
            }

        return observation

    def observed_if(self, possible: bool) -> Callable[[], dict] | None:
        """`observed_ahead` where the call about to be made may raise."""
        return self.observed_ahead() if possible and "bookkeeping" in self.checks else None

    def unchanged(self, observed_before: Callable[[], dict] | None, what: str) -> None:
        self.raised.append(what)
        if "bookkeeping" not in self.checks:
            return
        before, after = observed_before(), self.observe()
        diff = [f"{key} {before[key]} -> {after[key]}" for key in before if before[key] != after[key]]
        assert not diff, f"{what} changed the manager: {'; '.join(diff)}"

    # ---- steps, with explicit arguments: the rules draw them, pinned programs name them
    def do_allocate(self, tokens, sid=None) -> bool:
        """Allocate a new sequence.  What the call is checked against is asked of the state before it, answered
        with the call's own message in the implementation's process (`ahead`): the lookup of the prompt, the
        lookups that tell whether a block cached under another history lies where its hits end, and, where the
        pool may run out, the observation the call must leave as it was and the counts of the blocks it may hit."""
        if sid is None:
            self.next_id += 1
            sid = self.next_id
        free, writes, most = self.m.num_free_blocks(), self.storage.writes, -(-len(tokens) // self.B)
        before = self.observed_if(free < most)  # only then may it run out
        holders = self.holders(tokens) if free < most else []
        others = self.other_histories(tokens)
        counted = sorted({b for blocks in holders for b in blocks})
        asked = ahead(self.m, [("lookup_prefix", (self.hand(tokens),))] + [
            ("lookup_prefix", (list(other),)) for _, other in others] + [("ref_count", (b,)) for b in counted])
        self.shadow[sid] = list(tokens)
        self.kv.pop(sid, None)
        self.expect_filled(tokens)
        try:
            cached = self.call("allocate", sid, self.hand(tokens))
        except OutOfBlocks:
            cached = None
        promised, *answers = asked.values()
        found, counts = answers[:len(others)], dict(zip(counted, answers[len(others):], strict=True))
        if cached is None:
            del self.shadow[sid]
            need = self.most_needed(tokens, holders, promised, counts) if free < most else most
            assert free < need, (f"allocate of {len(tokens)} tokens ({promised} of them cached) raised "
                                 f"OutOfBlocks with {free} blocks free; it needs at most {need}")
            self.situation("OutOfBlocks: allocate")
            self.unchanged(before, f"allocate({sid}, {tokens}) raising OutOfBlocks")
            return False
        assert cached % self.B == 0 and 0 <= cached <= len(tokens), f"allocate reported {cached} cached"
        if "bookkeeping" in self.checks:  # the simulator counts recomputed tokens from these two numbers
            assert cached == promised, f"lookup_prefix promised {promised} tokens, allocate reported {cached}"
            computed = self.storage.writes - writes
            assert computed == len(tokens) - cached, (
                f"allocate reported {cached} of {len(tokens)} tokens cached but computed {computed}")
            self.filled_blocks_cached(sid, f"allocate({sid}, {tokens})")
        if cached >= 2 * self.B and len(tokens) > cached:
            self.situation("prefix: two or more cached blocks, then the prompt diverges")
        if cached and self.evicted - set(self.kv_ids(sid)):
            self.situation("prefix: a cached prefix reused after another was evicted")
        if self.evicted & set(self.kv_ids(sid)[cached + self.B - 1::self.B]):
            self.situation("prefix: an evicted prefix computed again")
        hits_end = promised // self.B
        if any(j == hits_end and hit == len(other) for (j, other), hit in zip(others, found, strict=True)):
            self.situation("prefix: the next block and the one before it cached under another history")
        self.history.append(list(tokens))
        return True

    def other_histories(self, tokens) -> list[tuple[int, list[int]]]:
        """(j, the tokens up to and including block j of another history) for each full GPU block j >= 2 that
        holds the same tokens as ``tokens``' block j and the block before it, but follows another prefix.  Where
        ``tokens``' cache hits end at block j (j = promised / B) and such a block is cached, a key over the
        previous block's tokens, not over its key, would serve that block."""
        B, out = self.B, []
        for block in self.storage.gpu:
            other = self.prefixes.tokens(block[-1]) if None not in block else ()
            j = len(other) // B - 1
            if (j >= 2 and len(tokens) >= (j + 1) * B and other[(j - 1) * B:] == tokens[(j - 1) * B:(j + 1) * B]
                    and other[:(j - 1) * B] != tokens[:(j - 1) * B]):
                out.append((j, other))
        return out

    def make_room(self, n: int, keep=()) -> None:
        """Free the oldest resident sequences but ``keep`` until ``n`` blocks are free: a scheduler finishing
        requests before it admits, resumes or forks one (most programs' pools are full)."""
        for sid in [s for s in self.resident() if s not in keep]:
            if self.m.num_free_blocks() >= n:
                return
            self.do_free(sid)

    def holders(self, tokens) -> list[list[int]]:
        """For each full block of ``tokens``, the GPU blocks whose storage holds its prefix's KV: a cached block is
        one of them."""
        B, gpu, ids = self.B, self.storage.gpu, self.prefixes.of(tokens)
        return [[b for b in range(len(gpu)) if gpu[b] == ids[i * B:(i + 1) * B]] for i in range(len(tokens) // B)]

    def most_needed(self, tokens, holders, promised, counts) -> int:
        """The most free blocks allocating ``tokens`` can take: one per block not cached, plus one per cached
        block that may be idle (it leaves the free pool): when every block holding its KV (``holders``) is in use
        (``counts``, the reference counts before the call), the hit is too."""
        need = -(-len(tokens) // self.B) - promised // self.B
        for i in range(promised // self.B):  # past the full blocks (a lookup promising too much), none holds it
            blocks = holders[i] if i < len(holders) else []
            need += not blocks or any(counts[b] == 0 for b in blocks)
        return need

    def do_append(self, sid, tokens) -> None:
        """Append token by token; one that needs a block (a new one, or a copy of a shared last block) with
        none free must raise OutOfBlocks, and only such a one may."""
        for token in tokens:
            n, last = len(self.shadow[sid]), self.m.block_table(sid)[-1]
            need = ("a new block" if n % self.B == 0 else
                    f"a copy of its shared last block {last}" if self.m.ref_count(last) > 1 else None)
            free, copies = self.m.num_free_blocks(), len(self.storage.trace)
            before = self.observed_if(need and free == 0)
            self.shadow[sid].append(token)
            if len(self.shadow[sid]) % self.B == 0:
                self.expect_filled(self.shadow[sid])
            try:
                self.call("append", sid, token)
            except OutOfBlocks:
                self.shadow[sid].pop()
                assert need and free == 0, (f"append to sequence {sid} raised OutOfBlocks with {free} blocks "
                                            f"free, needing {need or 'no block'}")
                self.situation("OutOfBlocks: append")
                self.unchanged(before, f"append({sid}, {token}) raising OutOfBlocks")
                return
            except Exception as exc:
                if need and free == 0:
                    raise AssertionError(f"append to sequence {sid} needed {need} with no block free and raised "
                                         f"{type(exc).__name__}: {exc}, not OutOfBlocks") from exc
                raise
            assert not (need and free == 0), (f"append to sequence {sid} needed {need} with no block free "
                                              "and did not raise OutOfBlocks")
            if any(c[0] == "copy" for c in self.storage.trace[copies:]):
                self.situation("copy-on-write of a shared last block")
            if "bookkeeping" in self.checks and len(self.shadow[sid]) % self.B == 0:
                self.filled_blocks_cached(sid, f"the append to sequence {sid} that filled its block "
                                               f"{len(self.shadow[sid]) // self.B - 1}")

    def expect_filled(self, tokens) -> None:
        """The lookups `filled_blocks_cached` makes after the call that leaves a sequence holding ``tokens``, brought
        back with that call's reply by a manager in the implementation's process."""
        full = len(tokens) // self.B * self.B
        if full and "bookkeeping" in self.checks:
            expect(self.m, [("lookup_prefix", (list(tokens[:full - self.B]),))] * (full > self.B) +
                   [("lookup_prefix", (list(tokens),))])

    def filled_blocks_cached(self, sid, what) -> None:
        """A block enters the prefix cache when it fills (the contract): once the blocks before the last full one
        are found, a lookup of the sequence's tokens finds every full block."""
        tokens, B = self.shadow[sid], self.B
        full = len(tokens) // B * B
        if full and (full == B or self.m.lookup_prefix(self.hand(tokens[:full - B])) == full - B):
            found = self.m.lookup_prefix(self.hand(tokens))
            assert found == full, (f"after {what}, lookup_prefix of its {len(tokens)} tokens finds {found} cached, "
                                   f"not {full}: a full block enters the prefix cache when it fills")

    def do_fork(self, parent, then=(), parent_then=(), parent_first=False) -> int:
        """Fork, then the child's appends and the parent's, in either order: the first writer of a shared
        partial last block copies it, the second (its count back to one) writes in place."""
        self.next_id += 1
        child = self.next_id
        self.call("fork", parent, child)
        self.shadow[child] = list(self.shadow[parent])
        if parent_then and parent_first and parent in self.swapped_in and len(self.shadow[parent]) % self.B:
            self.situation("swap: after swap_in and fork, the parent writes the shared last block first")
        for sid, tokens in ((parent, parent_then), (child, then))[::1 if parent_first else -1]:
            self.do_append(sid, tokens)
        return child

    def do_free(self, sid) -> None:
        self.call("free", sid)
        del self.shadow[sid]
        self.dead.add(sid)
        if sid in self.swapped:
            self.swapped.remove(sid)

    def do_preempt(self, sid) -> None:
        self.call("free", sid)
        self.preempted[sid] = self.shadow.pop(sid)

    def do_resume(self, sid) -> None:
        if self.do_allocate(self.preempted[sid], sid):
            del self.preempted[sid]
            self.situation("preemption: a sequence resumed by recompute")

    def do_lookup(self, tokens) -> None:
        cached = self.m.lookup_prefix(self.hand(tokens))
        assert cached % self.B == 0 and 0 <= cached <= len(tokens), f"lookup_prefix reported {cached}"

    def do_swap_out(self, sid) -> None:
        cpu_free, need = self.m.num_free_cpu_blocks(), len(self.m.block_table(sid))
        before = self.observed_if(cpu_free < need)
        try:
            self.call("swap_out", sid)
        except OutOfBlocks:
            assert cpu_free < need, f"swap_out raised OutOfBlocks with {cpu_free} CPU blocks free for {need}"
            self.situation("OutOfBlocks: swap_out")
            self.unchanged(before, f"swap_out({sid}) raising OutOfBlocks")
            return
        self.swapped.append(sid)
        cpu = list(self.m.block_table(sid))
        if need >= 2:
            self.situation("swap: a multi-block swap")
        if len(self.swapped) >= 2:
            self.situation("swap: several sequences swapped out at once")
        if set(cpu) & self.cpu_used:
            self.situation("swap: CPU blocks freed and used again")
        if cpu != sorted(cpu):
            self.situation("swap: a CPU table out of block-id order")
        self.cpu_used |= set(cpu)

    def do_swap_in(self, sid) -> None:
        free, need = self.m.num_free_blocks(), len(self.m.block_table(sid))
        before = self.observed_if(free < need)
        try:
            self.call("swap_in", sid)
        except OutOfBlocks:
            assert free < need, f"swap_in raised OutOfBlocks with {free} blocks free for {need}"
            self.situation("OutOfBlocks: swap_in")
            if free:
                self.situation("OutOfBlocks: swap_in with some blocks free")
            self.unchanged(before, f"swap_in({sid}) raising OutOfBlocks")
            return
        if sid != self.swapped[-1]:
            self.situation("swap: swapped back in out of order")
        self.swapped.remove(sid)
        self.swapped_in.add(sid)

    def do_reject(self, what, method, names, *args) -> None:
        """A call the contract rejects: ValueError, TypeError or KeyError naming the argument, and nothing
        observable changes (`observe`); the replay at teardown checks that the later calls behave as if it
        never happened."""
        before = self.observed_if(True)
        try:
            getattr(self.m, method)(*args)
        except (ValueError, TypeError, KeyError) as exc:
            assert names_argument(str(exc), *names), (
                f"{what}: {method}{args} raised '{type(exc).__name__}: {exc}', which names none of {names}")
        except OutOfBlocks as exc:
            raise AssertionError(f"{what}: {method}{args} raised OutOfBlocks ({exc}), not an error naming "
                                 f"{' or '.join(names)}") from exc
        else:
            raise AssertionError(f"{what}: {method}{args} was accepted; it must raise an error naming "
                                 f"{' or '.join(names)}")
        if self.shadow:
            self.situation("rejected: a call raises while sequences are live")
        self.unchanged(before, f"{what}, {method}{args}, raising")
