"""Properties of block managers (contract: harness/contracts/block_manager.py).

A Hypothesis state machine drives a manager with small pools -- allocate (prefix-cache lookups
included), append, fork, free, look up, preempt by recompute and resume, swap out and in (several
sequences at once, back in another order), and calls the contract rejects -- against a shadow model
that knows only each live sequence's tokens.  The caller's storage plays the model: the KV it writes
for token i of a sequence is (the interned id of) the sequence's whole prefix tokens[:i+1], so a block
reused under the wrong prefix reads back wrong.  The same machine backs two properties that check
different invariants after every step, so each mutant is killed for the reason it declares:
``machine_bookkeeping`` (pool conservation, reference counts = block-table entries, honest
out-of-memory, every observable unchanged by a call that raises, the accepted calls replayed on a fresh
manager make the same storage calls, a whole pool after freeing everything) and ``machine_data`` (what
each sequence reads through its block table is its shadow, no write into a block whose count exceeds
one).  Both replay the pinned programs (PINNED) first; `event()` counts the situations where
bookkeeping bugs live (SITUATIONS, ``--hypothesis-show-statistics``).  Programs reach them under memory pressure,
whichever rules Hypothesis's swarm testing leaves enabled: the initialize rule allocates two or three prompts (a
later one may share two or more blocks with one before and diverge), sends the shortest that fit on the CPU through
swap round trips (several out, a prompt admitted while they are out, back in swap order, the longest that fits
out), and runs up to 16 iterations of a vLLM-style scheduler (the ``schedule`` rule: swapped-out sequences back
first, oldest first, then recomputed ones, a new prompt, a fork of a sequence with a partial last block, a decode
step that preempts the newest sequence by swap or recompute); the fork, swap-in and evicted-prefix rules free the
oldest requests to make the room they need.  Fractions of the ci profile's programs reaching each (simple;
vllm_style), mean over seeds 0-23 [the lowest single run]: rejected call while live 98; 97 [94; 73], OutOfBlocks on
allocate 95; 99 [47; 94], on append 96; 96 [71; 73], on swap_out 74; 71 [47; 17], on swap_in 69; 74 [16; 30], on
swap_in with blocks free 61; 64 [6; 10]; resumed by recompute 83; 87 [43; 62]; copy-on-write 72; 72 [25; 50]; two
cached blocks then diverging 74; 71 [47; 40], a cached block evicted 83; 82 [61; 59], a cached prefix reused after
an eviction 70; 70 [3; 3], an evicted prefix computed again 67; 67 [3; 3]; multi-block swap 72; 76 [49; 47],
several swapped at once 74; 74 [56; 22], back in out of order 73; 69 [56; 19], CPU blocks reused 80; 71 [60; 50], a
CPU table out of block-id order 54; 62 [3; 43], parent writes first after swap_in and fork 57; 61 [22; 9].  A
single run's fractions hang on one program, the richest, which its target phase varies for most of the run.
tests/test_block_manager_reach.py checks the floors of SITUATIONS on the programs of seeds 0-3 pooled, and that
random programs alone (``run_machine(..., pinned=False)``) kill the mutants a pinned program once killed alone.
The order in which idle cached blocks are evicted depends on choices the contract leaves open once sequences share
and duplicate blocks, so ``evicts_least_recently_used`` checks it on one-block prompts, where it is exact;
``large_tables`` runs one program on tables past 256, 512 and 1,024 blocks.
"""

import collections
import functools

import hypothesis
import pytest
from hypothesis import Phase, event, example, given, settings, target
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness.contracts.block_manager import MAX_BLOCKS, NullStorage, OutOfBlocks, guarded_batch, open_manager
from harness.guard import ContractViolation, assert_rejected, call_limit, guarded_call, names_argument
from harness.registry import Impl
from harness.simulator.examples import block_size_waste, parallel_sampling, shared_prompt_answers
from harness.strategies.block_manager import (
    TOKEN_ALPHABET,
    EvictionProgram,
    PoolGeometry,
    appended_tokens,
    eviction_programs,
    pool_geometries,
    prompts,
    token_lists,
)

TECHNIQUE = "block_manager"
NOT_INTS = (1.5, "0", None)  # tokens the contract rejects: each would hash into the cache as another block


class Prefixes:
    """Token prefixes interned as ints (a trie): the KV of token i is the id of tokens[:i+1], so a slot compares in
    O(1) where the tuple of a 2,000-token prefix costs O(L) to build and compare."""

    def __init__(self):
        self.ids: dict[tuple[int, int], int] = {}
        self.nodes: list[tuple[int, int]] = []  # id -> (parent id, token); the empty prefix is -1

    def child(self, parent: int, token: int) -> int:
        if (parent, token) not in self.ids:
            self.ids[parent, token] = len(self.nodes)
            self.nodes.append((parent, token))
        return self.ids[parent, token]

    def tokens(self, node) -> list[int]:
        out = []
        while node is not None and node >= 0:
            node, token = self.nodes[node]
            out.append(token)
        return out[::-1]

    def shown(self, node) -> str:
        tokens = self.tokens(node) if node is not None else None
        return repr(tokens) if tokens is None or len(tokens) <= 12 else f"[..., {str(tokens[-8:])[1:]} ({len(tokens)})"


class ShadowStorage:
    """The caller's KV storage: slots hold the prefix id each token's KV was computed from; None = never written.
    ``trace`` keeps every call, in order (the replay compares it); ``overwritten`` the prefix ids of full blocks a
    write, copy or swap-in replaced (candidate evictions).  A sink (harness/engine/wire.py): a manager in the
    implementation's process has its storage calls replayed here when its call returns, so a write's block count
    is read after the call that made it (a write into a shared block leaves it shared: the same finding)."""

    harness_sink = True

    def __init__(self, geometry: PoolGeometry, kv_of):
        B = geometry.block_size
        self.gpu = [[None] * B for _ in range(geometry.num_blocks)]
        self.cpu = [[None] * B for _ in range(geometry.num_cpu_blocks)]
        self.kv_of, self.ref_count, self.violations = kv_of, None, []
        self.writes = 0  # token KVs computed so far: allocate must compute exactly those it did not find cached
        self.trace: list[tuple] = []
        self.overwritten: set[int] = set()

    def _into(self, pool, block, what):
        if not (isinstance(block, int) and 0 <= block < len(pool)):
            raise ContractViolation(f"{what}: block {block!r} is outside the pool of {len(pool)}")
        if pool is self.gpu:
            if self.ref_count(block) > 1:
                self.violations.append(f"{what} into block {block} whose reference count is {self.ref_count(block)}")
            if None not in pool[block]:
                self.overwritten.add(pool[block][-1])
        return pool[block]

    def write(self, block, offset, seq_id, position):
        self.trace.append(("write", block, offset, seq_id, position))
        self._into(self.gpu, block, "write")[offset] = self.kv_of(seq_id, position)
        self.writes += 1

    def copy(self, src, dst):
        self.trace.append(("copy", src, dst))
        self._into(self.gpu, dst, "copy")[:] = self.gpu[src]

    def swap_out(self, gpu_block, cpu_block):
        self.trace.append(("swap_out", gpu_block, cpu_block))
        self._into(self.cpu, cpu_block, "swap_out")[:] = self.gpu[gpu_block]

    def swap_in(self, cpu_block, gpu_block):
        self.trace.append(("swap_in", cpu_block, gpu_block))
        self._into(self.gpu, gpu_block, "swap_in")[:] = self.cpu[cpu_block]


class RecordingStorage(NullStorage):
    """What a fresh manager does with the data, for the replay: every call, as ShadowStorage records it."""

    def __init__(self):
        self.trace: list[tuple] = []

    def write(self, block, offset, seq_id, position):
        self.trace.append(("write", block, offset, seq_id, position))

    def copy(self, src, dst):
        self.trace.append(("copy", src, dst))

    def swap_out(self, gpu_block, cpu_block):
        self.trace.append(("swap_out", gpu_block, cpu_block))

    def swap_in(self, cpu_block, gpu_block):
        self.trace.append(("swap_in", cpu_block, gpu_block))


# The situations where bookkeeping bugs live, each with the fraction of the ci profile's programs that must reach it
# (both machines run the same programs): tests/test_block_manager_reach.py checks these floors on both correct
# managers on the programs of four seeds pooled; the fractions measured over 24 seeds are in the module docstring.
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


def machine_for(impl: Impl, checks: frozenset[str], reached: list[frozenset[str]] | None = None):
    """The state machine for ``impl`` checking ``checks``; each program's situations are appended to ``reached``."""
    impl_ = impl

    class BlockManagerMachine(RuleBasedStateMachine):
        failed = False  # a rule or invariant raised: teardown checks nothing
        impl = impl_

        @initialize(geometry=pool_geometries(), data=st.data())
        @step
        def build(self, geometry, data=None):
            """A pool and one to three prompts sharing prefixes (so that from the first step most rules apply)."""
            self.g, self.B = geometry, geometry.block_size
            self.prefixes = Prefixes()
            self.kv: dict[int, list[int]] = {}  # live sequence -> prefix ids of its tokens, grown lazily
            self.storage = ShadowStorage(geometry, lambda sid, pos: self.kv_ids(sid)[pos])
            self.m = open_manager(impl, geometry.num_blocks, self.B, self.storage,
                                  num_cpu_blocks=geometry.num_cpu_blocks, timed=False)
            self.storage.ref_count = self.m.ref_count if "data" in checks else (lambda block: 0)
            self.shadow: dict[int, list[int]] = {}  # live sequence -> its tokens
            self.swapped: list[int] = []  # in swap-out order
            self.preempted: dict[int, list[int]] = {}  # preempted by recompute -> tokens to recompute
            self.dead: set[int] = set()  # freed sequences: their ids are unknown to the manager now
            self.history: list[list[int]] = []
            self.given: list[tuple[list[int], tuple[int, ...]]] = []  # lists handed to the manager, as handed
            self.accepted: list[tuple] = []  # (method, args, result, storage calls) of every call that succeeded
            self.raised: list[str] = []  # calls that raised (rejected, or OutOfBlocks), for the replay's message
            self.evicted: set[int] = set()  # prefix ids of cached blocks seen evicted
            self.cpu_used: set[int] = set()  # CPU blocks some swap_out has used
            self.swapped_in: set[int] = set()
            self.seen: set[str] = set()  # situations reached: the score `target` raises
            self.next_id = 0
            for i in range(data.draw(st.integers(2, 3), label="first prompts") if data else 0):
                diverge = i > 0 and data.draw(st.booleans(), label="diverging prompt")  # a system prompt shared
                self.do_allocate(self.diverging(data) if diverge else data.draw(prompts(self.sources(), self.B),
                                                                                label="tokens"))
            if data and len(fit := self.fit_on_cpu()) >= 2:
                self.do_swap_round_trips(data, fit)  # while the prompts are short enough to swap several at once
            for _ in range(data.draw(st.sampled_from([8, 12, 4, 16, 0]), label="scheduler iterations") if data else 0):
                self.do_schedule(data)  # the pool under pressure before the first rule, whichever rules are enabled
            if data and self.shadow:
                self.do_rejected(data)

        def situation(self, name: str) -> None:
            situation(name, self.seen)

        def fit_on_cpu(self) -> list[int]:
            """The shortest resident sequences, as many as fit in the free CPU blocks together."""
            fit, room = [], self.m.num_free_cpu_blocks()
            for sid in sorted(self.resident(), key=lambda s: len(self.m.block_table(s))):
                if len(self.m.block_table(sid)) > room:
                    break
                fit.append(sid)
                room -= len(self.m.block_table(sid))
            return fit

        def kv_ids(self, sid) -> list[int]:
            tokens, ids = self.shadow[sid], self.kv.setdefault(sid, [])
            del ids[len(tokens):]
            while len(ids) < len(tokens):
                ids.append(self.prefixes.child(ids[-1] if ids else -1, tokens[len(ids)]))
            return ids

        def hand(self, tokens) -> list[int]:
            """A fresh list for the manager, remembered: a manager that keeps it and appends to it (aliasing the
            caller's prompt) shows up in `bookkeeping`."""
            self.given.append((mine := list(tokens), tuple(tokens)))
            return mine

        def call(self, method, *args):
            """A call that must succeed, recorded with its storage calls for the replay."""
            start = len(self.storage.trace)
            out = getattr(self.m, method)(*args)
            if "bookkeeping" in checks:
                kept = tuple(list(a) if isinstance(a, list) else a for a in args)
                self.accepted.append((method, kept, out, tuple(self.storage.trace[start:])))
            return out

        def table(self, sid) -> list[int]:
            """block_table(sid); the list it returns is the caller's, so it is cleared after reading: a manager that
            handed out its own table shows here."""
            got = self.m.block_table(sid)
            table = list(got)
            got.clear()
            again = self.m.block_table(sid)
            assert list(again) == table, (f"sequence {sid}: block_table returned the manager's own list: clearing "
                                          f"the returned {table} changed the manager's table to {list(again)}")
            return table

        def resident(self):
            return sorted(set(self.shadow) - set(self.swapped))

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

        # ---- what a call that raises must leave as it was
        def observe(self) -> dict:
            """What a call that raises must leave as it was: the block tables, the reference counts, the free counts,
            the cache as lookups of the 8 latest distinct earlier prompts see it, the storage calls made so far.
            (The token counts and is_swapped follow the shadow, which such a call leaves alone: the invariants
            check those after the step; the replay at teardown, what the calls after it do.)"""
            return {
                "block tables": {s: list(self.m.block_table(s)) for s in sorted(self.shadow)},
                "reference counts": [self.m.ref_count(b) for b in range(self.g.num_blocks)],
                "free blocks (GPU, CPU)": (self.m.num_free_blocks(), self.m.num_free_cpu_blocks()),
                "lookup_prefix of earlier prompts": {p: self.m.lookup_prefix(list(p)) for p in self.earlier()[-8:]},
                "storage calls": len(self.storage.trace),
            }

        def unchanged(self, before: dict, what: str) -> None:
            self.raised.append(what)
            if "bookkeeping" not in checks:
                return
            after = self.observe()
            diff = [f"{key} {before[key]} -> {after[key]}" for key in before if before[key] != after[key]]
            assert not diff, f"{what} changed the manager: {'; '.join(diff)}"

        def observed_if(self, possible: bool) -> dict | None:
            return self.observe() if possible and "bookkeeping" in checks else None

        # ---- steps, with explicit arguments: the rules draw them, pinned programs (PINNED) name them
        def do_allocate(self, tokens, sid=None):
            if sid is None:
                self.next_id += 1
                sid = self.next_id
            free, writes = self.m.num_free_blocks(), self.storage.writes
            promised = self.m.lookup_prefix(self.hand(tokens))
            need = -(-len(tokens) // self.B)
            need = self.most_needed(tokens, promised) if free < need else need
            before = self.observed_if(free < need)  # only then may it run out
            self.shadow[sid] = list(tokens)
            self.kv.pop(sid, None)
            try:
                cached = self.call("allocate", sid, self.hand(tokens))
            except OutOfBlocks:
                del self.shadow[sid]
                assert free < need, (f"allocate of {len(tokens)} tokens ({promised} of them cached) raised "
                                     f"OutOfBlocks with {free} blocks free; it needs at most {need}")
                self.situation("OutOfBlocks: allocate")
                self.unchanged(before, f"allocate({sid}, {tokens}) raising OutOfBlocks")
                return False
            assert cached % self.B == 0 and 0 <= cached <= len(tokens), f"allocate reported {cached} cached"
            if "bookkeeping" in checks:  # the simulator counts recomputed tokens from these two numbers
                assert cached == promised, f"lookup_prefix promised {promised} tokens, allocate reported {cached}"
                computed = self.storage.writes - writes
                assert computed == len(tokens) - cached, (
                    f"allocate reported {cached} of {len(tokens)} tokens cached but computed {computed}")
            if cached >= 2 * self.B and len(tokens) > cached:
                self.situation("prefix: two or more cached blocks, then the prompt diverges")
            if cached and self.evicted - set(self.kv_ids(sid)):
                self.situation("prefix: a cached prefix reused after another was evicted")
            if self.evicted & set(self.kv_ids(sid)[cached + self.B - 1::self.B]):
                self.situation("prefix: an evicted prefix computed again")
            self.history.append(list(tokens))
            return True

        def make_room(self, n: int, keep=()) -> None:
            """Free the oldest resident sequences but ``keep`` until ``n`` blocks are free: a scheduler finishing
            requests before it admits, resumes or forks one (most programs' pools are full)."""
            for sid in [s for s in self.resident() if s not in keep]:
                if self.m.num_free_blocks() >= n:
                    return
                self.do_free(sid)

        def most_needed(self, tokens, promised) -> int:
            """The most free blocks allocating ``tokens`` can take: one per block not cached, plus one per cached
            block that may be idle (it leaves the free pool).  A cached block holds its prefix's KV, so it is one
            of the GPU blocks whose storage holds that; when every such block is in use, the hit is too."""
            B, gpu, p, ids = self.B, self.storage.gpu, self.prefixes, []
            for t in tokens:
                ids.append(p.child(ids[-1] if ids else -1, t))
            need = -(-len(tokens) // B) - promised // B
            for i in range(promised // B):
                holders = [b for b in range(len(gpu)) if gpu[b] == ids[i * B:(i + 1) * B]]
                need += not holders or any(self.m.ref_count(b) == 0 for b in holders)
            return need

        def do_append(self, sid, tokens):
            """Append token by token; one that needs a block (a new one, or a copy of a shared last block) with
            none free must raise OutOfBlocks, and only such a one may."""
            for token in tokens:
                n, last = len(self.shadow[sid]), self.m.block_table(sid)[-1]
                need = ("a new block" if n % self.B == 0 else
                        f"a copy of its shared last block {last}" if self.m.ref_count(last) > 1 else None)
                free, copies = self.m.num_free_blocks(), len(self.storage.trace)
                before = self.observed_if(need and free == 0)
                self.shadow[sid].append(token)
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

        def do_fork(self, parent, then=(), parent_then=(), parent_first=False):
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

        def do_free(self, sid):
            self.call("free", sid)
            del self.shadow[sid]
            self.dead.add(sid)
            if sid in self.swapped:
                self.swapped.remove(sid)

        def do_preempt(self, sid):
            self.call("free", sid)
            self.preempted[sid] = self.shadow.pop(sid)

        def do_resume(self, sid):
            if self.do_allocate(self.preempted[sid], sid):
                del self.preempted[sid]
                self.situation("preemption: a sequence resumed by recompute")

        def do_lookup(self, tokens):
            cached = self.m.lookup_prefix(self.hand(tokens))
            assert cached % self.B == 0 and 0 <= cached <= len(tokens), f"lookup_prefix reported {cached}"

        def do_swap_out(self, sid):
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

        def do_swap_in(self, sid):
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

        def do_reject(self, what, method, names, *args):
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

        # ---- rules
        def tokens(self, data, sid, label, min_size):
            return data.draw(appended_tokens(self.shadow[sid], self.sources(), self.B, min_size), label=label)

        @rule(data=st.data())
        @step
        def allocate(self, data):
            self.do_allocate(data.draw(prompts(self.sources(), self.B), label="tokens"))

        @rule(data=st.data())
        @step
        def allocate_diverging(self, data):
            self.do_allocate(self.diverging(data))

        def diverging(self, data) -> list[int]:
            """A prompt sharing two or more full blocks with an earlier one, then diverging (a system prompt and
            few-shot examples, then another question): chained hashes must tell the tails apart.  With no source
            of two full blocks yet, a fresh prompt of two blocks and a token makes one."""
            B, long = self.B, [p for p in self.sources() if len(p) >= 2 * self.B]
            if not long:
                return data.draw(token_lists(B, 2 * B + 1, 2 * B + 1), label="tokens")
            base = data.draw(st.sampled_from(long), label="base")
            cut = B * data.draw(st.integers(2, len(base) // B), label="shared blocks")
            tail = data.draw(token_lists(B, min_size=1), label="tail")
            if cut < len(base) and tail[0] == base[cut]:
                tail[0] = (tail[0] + 1) % TOKEN_ALPHABET
            return base[:cut] + tail

        @precondition(lambda self: self.evicted)
        @rule(data=st.data())
        @step
        def allocate_evicted(self, data):
            """A prompt through a prefix seen evicted (a request returning to a conversation whose KV was dropped),
            room made for it: its leading blocks still cached are hits, the evicted block is computed again (a hash
            left behind would serve the block's new contents)."""
            node = data.draw(st.sampled_from(sorted(self.evicted)), label="evicted prefix")
            tokens = self.prefixes.tokens(node) + data.draw(token_lists(self.B, 0, self.B), label="tail")
            self.make_room(-(-len(tokens) // self.B))
            self.do_allocate(tokens)

        @precondition(lambda self: self.preempted)
        @rule(data=st.data())
        @step
        def resume_preempted(self, data):
            self.do_resume(data.draw(st.sampled_from(sorted(self.preempted)), label="resume"))

        @precondition(lambda self: self.resident())
        @rule(data=st.data())
        @step
        def append(self, data):
            sid = data.draw(st.sampled_from(self.resident()), label="append to")
            self.do_append(sid, self.tokens(data, sid, "tokens", 1))

        @precondition(lambda self: self.resident())
        @rule(data=st.data())
        @step
        def fork(self, data):
            """Fork, then append to the child and to the parent: the first token of each copies a shared partial
            last block (the parent's after the child's, when its count is down to one, writes in place)."""
            parent = data.draw(st.sampled_from(self.resident()), label="fork")
            then = self.tokens(data, parent, "child appends", 0)
            parent_then = data.draw(token_lists(self.B, max_size=self.B), label="parent appends")
            self.do_fork(parent, then, parent_then, data.draw(st.booleans(), label="parent first"))

        def partial(self, sids) -> list[int]:
            return [s for s in sids if len(self.shadow[s]) % self.B]

        @precondition(lambda self: self.partial(self.resident()))
        @rule(data=st.data())
        @step
        def fork_and_write(self, data):
            """The fork rule on a sequence whose last block is partial, with a block made free for the copy: the
            first writer copies the shared block (copy-on-write), the second writes in place."""
            parent = data.draw(st.sampled_from(self.partial(self.resident())), label="fork")
            self.make_room(2, keep={parent})
            then = self.tokens(data, parent, "child appends", 0)
            parent_then = data.draw(token_lists(self.B, max_size=self.B), label="parent appends")
            self.do_fork(parent, then, parent_then, data.draw(st.booleans(), label="parent first"))

        @precondition(lambda self: self.shadow)
        @rule(data=st.data())
        @step
        def free(self, data):
            self.do_free(data.draw(st.sampled_from(sorted(self.shadow)), label="free"))

        @precondition(lambda self: self.resident())
        @rule(data=st.data())
        @step
        def preempt_by_recompute(self, data):
            self.do_preempt(data.draw(st.sampled_from(self.resident()), label="preempt"))

        @precondition(lambda self: self.history)
        @rule(data=st.data())
        @step
        def lookup_prefix(self, data):
            self.do_lookup(data.draw(prompts(self.sources(), self.B), label="lookup"))

        @precondition(lambda self: self.resident())
        @rule(data=st.data())
        @step
        def swap_out(self, data):
            self.do_swap_out(data.draw(st.sampled_from(self.resident()), label="swap out"))

        @precondition(lambda self: self.swapped)
        @rule(data=st.data())
        @step
        def swap_in(self, data):
            self.do_swap_in(data.draw(st.sampled_from(sorted(self.swapped)), label="swap in"))

        @precondition(lambda self: len(self.resident()) >= 2)
        @rule(data=st.data())
        @step
        def swap_several(self, data):
            """Preemption of a batch by swap: two or more sequences out, then some back in another order, so CPU
            blocks return to the pool out of order and the next swap_out takes them in a new order."""
            out = data.draw(st.lists(st.sampled_from(self.resident()), min_size=2, max_size=4, unique=True),
                            label="swap out")
            for sid in out:
                self.do_swap_out(sid)
            back = data.draw(st.permutations(self.swapped), label="swap in order")
            for sid in back[:data.draw(st.integers(0, len(back)), label="swap in count")]:
                self.do_swap_in(sid)
            longest = max(self.resident(), key=lambda s: len(self.shadow[s]), default=None)
            if longest is not None and data.draw(st.booleans(), label="then swap out the longest"):
                self.do_swap_out(longest)  # takes the CPU blocks just returned, in the order they came back
                if longest in self.swapped and data.draw(st.booleans(), label="and back in"):
                    self.do_swap_in(longest)  # its swap_out just freed its blocks (but those it shares)

        @precondition(lambda self: len(self.resident()) >= 2 and self.g.num_cpu_blocks >= 2)
        @rule(data=st.data())
        @step
        def swap_round_trips(self, data):
            self.do_swap_round_trips(data)

        def do_swap_round_trips(self, data, batch=None):
            """A batch swapped out and back in, longest first, a few times (a prompt may be admitted while it is out
            the first time: a swap_in then runs out with some blocks free), then the longest sequence that fits out: a
            LIFO pool of CPU blocks hands it the shortest's blocks (swapped out last: higher ids) and then others', and
            a FIFO pool comes round to its returned blocks: its CPU table is out of block-id order."""
            if batch is None:
                batch = data.draw(st.lists(st.sampled_from(self.resident()), min_size=2, max_size=3, unique=True),
                                  label="swap round trips of")
            batch.sort(key=lambda s: -len(self.shadow[s]))  # the shortest back in last: on top of a LIFO pool
            if len(self.m.block_table(batch[0])) == len(self.m.block_table(batch[-1])):  # the first decodes a block
                # more: the last swap_out, longer than the shortest's table, then spans two tables a LIFO pool got back
                self.do_append(batch[0], data.draw(token_lists(self.B, self.B, self.B), label="decoded"))
            for k in range(data.draw(st.integers(1, 4), label="round trips")):
                for sid in [s for s in batch if s in self.resident()]:  # one left out by a swap_in short of blocks
                    self.do_swap_out(sid)
                if k == 0 and data.draw(st.booleans(), label="a prompt admitted while they are out"):
                    self.do_allocate(data.draw(prompts(self.sources(), self.B), label="tokens"))  # a swap_in runs out
                for sid in [s for s in batch if s in self.swapped]:
                    self.do_swap_in(sid)
            room = self.m.num_free_cpu_blocks()
            fits = [s for s in self.resident() if len(self.m.block_table(s)) <= room]
            if fits:  # the longest that fits in the CPU blocks left
                self.do_swap_out(max(fits, key=lambda s: len(self.m.block_table(s))))

        @rule(data=st.data())
        @step
        def schedule(self, data):
            self.do_schedule(data)

        def do_schedule(self, data):
            """One iteration of a vLLM-style scheduler (Kwon et al. 2023, Sec. 4.5): swapped-out sequences come back
            first, oldest first (so out of swap order), until one finds too few blocks; preempted ones are recomputed;
            a new prompt is admitted; one running sequence may fork (parallel sampling) and write first; every running
            sequence decodes a token, and one that finds no block preempts the newest running sequence, by swap or
            by recompute.  Nearly every situation comes up under this memory pressure."""
            back = []
            for sid in list(self.swapped):
                self.do_swap_in(sid)
                if sid in self.swapped:
                    break
                back.append(sid)
            for sid in sorted(self.preempted):
                self.do_resume(sid)
            diverge = data.draw(st.booleans(), label="diverging prompt")
            self.do_allocate(self.diverging(data) if diverge else data.draw(prompts(self.sources(), self.B),
                                                                            label="tokens"))
            running, token = self.resident(), st.integers(0, TOKEN_ALPHABET - 1)
            forked = ()
            if running and data.draw(st.booleans(), label="fork"):
                parents = self.partial(back) or self.partial(running) or running  # a partial last block: copy-on-write
                forked = (data.draw(st.sampled_from(parents), label="parent"),)
                self.make_room(1, keep=forked)  # a finished request frees the block its copy-on-write takes
                running = self.resident()
                self.do_fork(forked[0], (), [data.draw(token, label="parent token")], parent_first=True)
            for sid in [s for s in running if s not in forked]:
                if sid not in self.resident():
                    continue  # preempted by an earlier one this iteration
                n = len(self.shadow[sid])
                self.do_append(sid, [data.draw(token, label="token")])
                if len(self.shadow[sid]) == n:
                    victim = max(self.resident())
                    if data.draw(st.booleans(), label="preempt by swap"):
                        self.do_swap_out(victim)
                    if victim not in self.swapped:
                        self.do_preempt(victim)

        @precondition(lambda self: self.swapped)
        @rule(data=st.data())
        @step
        def swap_in_and_fork(self, data):
            """A swapped-out request resumes and samples again (parallel sampling, beam search): swap_in, fork, the
            parent then the child write the shared last block -- its count is 2 again, on a block swap_in just
            made."""
            sid = data.draw(st.sampled_from(self.partial(self.swapped) or self.swapped), label="swap in")
            self.make_room(len(self.shadow[sid]) // self.B + 2)  # its blocks and the copy of its last one
            self.do_swap_in(sid)
            if sid not in self.swapped:
                self.do_fork(sid, self.tokens(data, sid, "child appends", 0),
                             data.draw(token_lists(self.B, 1, max_size=self.B), label="parent appends"),
                             parent_first=True)  # the child first: the fork rule

        @rule(data=st.data())
        @step
        def rejected_call(self, data):
            self.do_rejected(data)

        def do_rejected(self, data):
            what, method, names, args = data.draw(st.sampled_from(self.bad_calls()), label="rejected call")
            self.do_reject(what, method, names, *args(data))

        @precondition(lambda self: self.shadow)
        @rule(data=st.data())
        @step
        def rejected_call_while_live(self, data):
            """The same, once sequences are live (a second rule: Hypothesis weighs rules equally), where a rejected
            call has tables, counts and cached blocks to disturb."""
            self.do_rejected(data)

        def bad_calls(self):
            """The calls the contract rejects in this state: (what, method, names, draw the arguments)."""
            live, res, out, n = sorted(self.shadow), self.resident(), self.swapped, self.g.num_blocks
            unknown = st.sampled_from(self.unknown_ids())
            new = self.next_id + 1  # never allocated: a call that accepts it makes a sequence the shadow lacks
            sid = ("seq_id",)
            cases = [
                ("allocate of no tokens", "allocate", ("tokens",), lambda d: (new, self.hand([]))),
                ("allocate of a token that is not an int", "allocate", ("tokens",), lambda d: (new, self.hand(
                    [*d.draw(prompts(self.sources(), self.B)), d.draw(st.sampled_from(NOT_INTS))]))),
                ("append to a freed sequence", "append", sid, lambda d: (d.draw(unknown), 0)),
                ("fork of a freed parent", "fork", ("parent_id", "seq_id"), lambda d: (d.draw(unknown), new)),
                ("free of a freed sequence", "free", sid, lambda d: (d.draw(unknown),)),
                ("swap_out of a freed sequence", "swap_out", sid, lambda d: (d.draw(unknown),)),
                ("swap_in of a freed sequence", "swap_in", sid, lambda d: (d.draw(unknown),)),
                ("block_table of a freed sequence", "block_table", sid, lambda d: (d.draw(unknown),)),
                ("lookup_prefix of no tokens", "lookup_prefix", ("tokens",), lambda d: (self.hand([]),)),
                ("ref_count outside the pool", "ref_count", ("block",), lambda d: (d.draw(st.sampled_from([-1, n])),)),
            ]
            if live:
                cases.append(("allocate under a live seq_id (its own tokens: cache hits)", "allocate", sid,
                              lambda d: (s := d.draw(st.sampled_from(live)), self.hand(self.shadow[s]))))
            if res:
                cases += [
                    ("append of a token that is not an int", "append", ("token",),
                     lambda d: (d.draw(st.sampled_from(res)), d.draw(st.sampled_from(NOT_INTS)))),
                    ("fork onto a live child_id", "fork", ("child_id",),
                     lambda d: (d.draw(st.sampled_from(res)), d.draw(st.sampled_from(live)))),
                    ("swap_in of a resident sequence", "swap_in", sid, lambda d: (d.draw(st.sampled_from(res)),)),
                ]
            if out:
                cases += [
                    ("append to a swapped-out sequence", "append", sid, lambda d: (d.draw(st.sampled_from(out)), 0)),
                    ("fork of a swapped-out parent", "fork", ("parent_id", "seq_id"),
                     lambda d: (d.draw(st.sampled_from(out)), new)),
                    ("swap_out of a swapped-out sequence", "swap_out", sid, lambda d: (d.draw(st.sampled_from(out)),)),
                ]
            return cases

        # ---- invariants
        @invariant()
        @step
        def bookkeeping(self):
            if "bookkeeping" not in checks or not hasattr(self, "m"):
                return
            for kept, handed in self.given:
                assert tuple(kept) == handed, (f"the token list {list(handed)} handed to allocate/lookup_prefix "
                                                f"became {kept}: the manager kept the caller's list and changed it")
            n = self.g.num_blocks
            entries = [0] * n
            tables = {sid: self.table(sid) for sid in self.shadow}
            for sid, tokens in self.shadow.items():
                table = tables[sid]
                assert self.m.is_swapped(sid) == (sid in self.swapped), f"sequence {sid}: is_swapped is wrong"
                assert self.m.num_tokens(sid) == len(tokens), f"sequence {sid}: num_tokens is wrong"
                assert len(table) == -(-len(tokens) // self.B), (
                    f"sequence {sid}: {len(tokens)} tokens but a block table of {len(table)} blocks")
                pool = self.g.num_cpu_blocks if sid in self.swapped else n
                assert all(0 <= b < pool for b in table), f"sequence {sid}: block table {table} leaves its pool"
                if sid not in self.swapped:
                    for b in table:
                        entries[b] += 1
            counts = [self.m.ref_count(b) for b in range(n)]
            assert counts == entries, f"reference counts {counts} != block-table entries {entries}"
            used, free = sum(c > 0 for c in counts), self.m.num_free_blocks()
            assert free + used == n, f"free {free} + used {used} != pool size {n}"
            cpu_used, cpu_free = {b for sid in self.swapped for b in tables[sid]}, self.m.num_free_cpu_blocks()
            assert cpu_free + len(cpu_used) == self.g.num_cpu_blocks, (
                f"CPU pool: free {cpu_free} + used {len(cpu_used)} != {self.g.num_cpu_blocks}")

        @invariant()
        @step
        def data_reads_back(self):
            if not hasattr(self, "m"):
                return
            self.note_evictions()
            if "data" not in checks:
                return
            assert not self.storage.violations, self.storage.violations[0]
            for sid, tokens in self.shadow.items():
                pool = self.storage.cpu if self.m.is_swapped(sid) else self.storage.gpu
                table, want = self.m.block_table(sid), self.kv_ids(sid)
                for i in range(len(tokens)):
                    got = pool[table[i // self.B]][i % self.B]
                    assert got == want[i], (f"sequence {sid} reads token {i} through block {table[i // self.B]} "
                                            f"as the KV of {self.prefixes.shown(got)}, expected "
                                            f"{self.prefixes.shown(want[i])}")

        def note_evictions(self):
            """Full blocks overwritten since the last step whose prefix is no longer found: evicted (for events)."""
            for node in self.storage.overwritten - self.evicted:
                tokens = self.prefixes.tokens(node)
                if self.m.lookup_prefix(tokens) < len(tokens):
                    self.evicted.add(node)
                    self.situation("prefix: a cached block evicted")
            self.storage.overwritten.clear()

        def replay(self):
            """The accepted calls on a fresh manager, none of the calls that raised: the same results and storage
            calls, or a call that raised (or a query) changed hidden state (the contract's determinism)."""
            storage = RecordingStorage()
            twin = open_manager(impl, self.g.num_blocks, self.B, storage, num_cpu_blocks=self.g.num_cpu_blocks,
                                timed=False)
            for k, (method, args, out, made) in enumerate(self.accepted):
                start = len(storage.trace)
                try:
                    got = getattr(twin, method)(*(list(a) if isinstance(a, list) else a for a in args))
                except Exception as exc:  # noqa: BLE001 - reported as the divergence it is
                    got = f"{type(exc).__name__}: {exc}"
                again = tuple(storage.trace[start:])
                assert (got, again) == (out, made), (
                    f"the {k + 1}th accepted call {method}{args} returned {out!r} with storage calls {list(made)[:8]}; "
                    f"on a fresh manager given only the accepted calls it returned {got!r} with {list(again)[:8]}: "
                    f"a call that raised ({'; '.join(self.raised[-4:])}) or a query changed the manager")

        def teardown(self):
            if hasattr(self, "seen") and currently_in_test_context():
                target(float(len(self.seen)), label="situations reached")  # steers generation toward rich programs
                if reached is not None:
                    reached.append(frozenset(self.seen))
            if "bookkeeping" in checks and hasattr(self, "m") and not self.failed:
                guarded_batch(impl, self.pool_whole_at_end)

        def pool_whole_at_end(self):
            if self.raised:
                self.replay()
            for sid in list(self.shadow):
                self.m.free(sid)
            n = self.g.num_blocks
            assert self.m.num_free_blocks() == n, f"after freeing everything {self.m.num_free_blocks()} of {n} free"
            assert all(self.m.ref_count(b) == 0 for b in range(n)), "after freeing everything a count is not 0"
            assert self.m.num_free_cpu_blocks() == self.g.num_cpu_blocks, "after freeing everything CPU blocks leak"

    BlockManagerMachine.__name__ = f"BlockManagerMachine[{impl.name}]"
    return BlockManagerMachine


# Programs that once found a bug (wrong plugins of a review), replayed step by step with both checks before the
# machine runs: the state machine's @example.  Sequence ids count from 1 in allocation/fork order.
PINNED = {
    # a block table handed out as the manager's own list
    "block_table_alias": (PoolGeometry(2, 4, 0), [("allocate", [0, 1, 2])]),
    # prefix match that skips a missing block: [0, 0] evicted, [0, 0, 1, 1]'s second block (cached by sequence 2,
    # grown by appends) still cached, found at position 0
    "hits_skip_miss": (PoolGeometry(2, 4, 0), [
        ("allocate", [0, 0]), ("allocate", [0]), ("append", 2, [0, 1, 1]), ("free", 1), ("allocate", [2, 2]),
        ("allocate", [2, 1]), ("free", 3), ("free", 4), ("lookup", [0, 0, 1, 1]), ("allocate", [0, 0, 1, 1])]),
    # a fork sharing its parent's list of block hashes: both diverge after the fork
    "fork_shares_hashes": (PoolGeometry(2, 8, 0), [
        ("allocate", [0, 0]), ("fork", 1, [1, 1]), ("append", 1, [2, 2]), ("allocate", [0, 0, 1, 1, 2, 2])]),
    # block hashes chained on the parent's physical block id, which is recycled
    "parent_id_chain": (PoolGeometry(1, 4, 0), [
        ("allocate", [1, 0]), ("allocate", [1]), ("append", 2, [0, 2]), ("free", 2), ("allocate", [2]),
        ("allocate", [2, 2])]),
    # swap_in taking back its old GPU block, reused and overwritten meanwhile, without copying
    "swap_in_reuses_free": (PoolGeometry(1, 1, 1), [
        ("allocate", [0]), ("swap_out", 1), ("allocate", [1]), ("free", 2), ("swap_in", 1)]),
    # append's out-of-blocks check forgetting that copy-on-write takes a block
    "append_oob_ignores_cow": (PoolGeometry(2, 1, 0), [("allocate", [0]), ("fork", 1, []), ("append", 1, [1])]),
    # swapped blocks restored in CPU-id order: two one-block sequences swapped out and back in the same order return
    # their CPU blocks so that the next swap_out of two blocks takes them in descending id order
    "swap_in_id_order": (PoolGeometry(1, 4, 4), [
        ("allocate", [0]), ("allocate", [1]), ("swap_out", 1), ("swap_out", 2), ("swap_in", 1), ("swap_in", 2),
        ("allocate", [2, 3]), ("swap_out", 3), ("swap_in", 3)]),
    # a swap_in that runs out with one idle cached block free, evicting it before giving up
    "swap_in_oob_evicts": (PoolGeometry(1, 2, 2), [
        ("allocate", [0, 1]), ("swap_out", 1), ("allocate", [2]), ("swap_in", 1)]),
    # copy-on-write decided by a "fresh from swap_in" flag: a fork after swap_in shares the last block again, and the
    # parent's write must copy it
    "cow_after_swap_in": (PoolGeometry(2, 4, 2), [
        ("allocate", [0]), ("swap_out", 1), ("swap_in", 1), ("fork", 1, [], [5], True)]),
    # a fork rejected for a live child_id that has already raised its parent's counts (rejected calls are one rule
    # among many: the random programs of a seed may hold none with a live child_id)
    "fork_counts_before_check": (PoolGeometry(2, 4, 0), [
        ("allocate", [0, 1]), ("allocate", [2]), ("reject", "fork onto a live child_id", "fork", ("child_id",), 1, 2)]),
    # allocate's capacity check counting a cached prefix held by a live sequence as new blocks (vLLM v0)
    "oob_ignores_hits": (PoolGeometry(2, 3, 0), [("allocate", [0, 0]), ("allocate", [1, 1]), ("allocate", [0, 0, 2])]),
}


def run_program(impl: Impl, geometry: PoolGeometry, program, checks=frozenset({"bookkeeping", "data"})) -> None:
    """One program, step by step (``("allocate", tokens)``, ``("append", sid, tokens)``, ...: the machine's do_*),
    every invariant after every step, and the teardown's checks."""
    machine = machine_for(impl, checks)()
    try:
        machine.build(geometry)
        for op, *args in program:
            getattr(machine, f"do_{op}")(*args)
            machine.bookkeeping()
            machine.data_reads_back()
    except BaseException:
        machine.failed = True
        raise
    finally:
        machine.teardown()


def replay_pinned(impl: Impl, checks: frozenset[str]) -> None:
    for name, (geometry, program) in PINNED.items():
        try:
            run_program(impl, geometry, program, checks)
        except BaseException as exc:
            exc.add_note(f"pinned program {name!r} on {geometry}: {program}")
            raise


def run_machine(impl: Impl, checks: frozenset[str], *, pinned: bool = True, profile: settings | None = None,
                seed: int | None = None, reached: list[frozenset[str]] | None = None) -> None:
    """Replay the pinned programs (unless not ``pinned``: what the random programs find alone), then run under
    ``profile`` (default: the loaded one), minus the explain phase (on a failing machine it replays the whole
    program once per step: ~55 s of a ~57 s kill), shrinking one failure only (a wrong manager fails several
    invariants, and shrinking each took a kill from ~20 s to ~700 s), from ``seed`` if given (a derandomized
    profile seeds from the machine's source, which every edit changes); ``reached`` collects each program's
    situations."""
    if pinned:
        replay_pinned(impl, checks)
    profile = profile or settings.default
    machine = machine_for(impl, checks, reached)
    run_state_machine_as_test(machine if seed is None else hypothesis.seed(seed)(machine), settings=settings(
        profile, phases=[p for p in profile.phases if p != Phase.explain], report_multiple_bugs=False))


def test_machine_bookkeeping(impl):
    """Pool conservation, reference counts = block-table entries, declared out-of-memory, nothing changed by a call
    that raises (the later calls replayed without it), pool whole at the end."""
    run_machine(impl, frozenset({"bookkeeping"}))


def test_machine_data(impl):
    """Every live sequence reads its own tokens' KV through its block table; no write lands in a shared block."""
    run_machine(impl, frozenset({"data"}))


LARGE_TABLES = (257, 513, 1025)  # just past 2**8, 2**9, 2**10 blocks: a table or a block id kept in fixed width wraps


def test_large_tables(impl):
    """Tables of 258, 514 and 1,026 blocks (block size 2) in pools of twice that: a prompt, a second one hitting all
    but two of its blocks and diverging, a fork appending, a swap out and in of the whole table, an append across
    a block boundary, everything freed, the prompt allocated again from the cache -- both machines' checks after
    every step (the block ids and tables the state machine's pools of <= 12 blocks never reach)."""
    B = 2
    for T in LARGE_TABLES:
        prompt = [(i * i + i // 7) % TOKEN_ALPHABET for i in range(T * B + 1)]  # T full blocks, one partial
        diverged = prompt[:(T - 2) * B] + [(prompt[(T - 2) * B] + 1) % TOKEN_ALPHABET]
        program = [("allocate", prompt), ("allocate", diverged), ("fork", 1, [0]), ("swap_out", 1), ("swap_in", 1),
                   ("append", 1, [1, 2]), ("free", 2), ("free", 3), ("free", 1), ("allocate", prompt + [0, 1])]
        try:
            run_program(impl, PoolGeometry(B, 2 * T + 8, T + 2), program)
        except BaseException as exc:
            exc.add_note(f"a table of {T + 1} blocks")
            raise


# ---------------------------------------------------------------------------------------------
# worked examples (vLLM paper Sec. 4.4 and hand-worked ones), computed through the manager
def test_parallel_sampling_saves_70_percent(impl):
    """One 512-token prompt sampled 8 times for 128 tokens, block 16: 5,120 token slots unshared, 1,536 shared."""
    got = parallel_sampling(impl, prompt=512, samples=8, output=128, block_size=16)
    assert (got.unshared_slots, got.shared_slots) == (5120, 1536), got
    assert got.shared_slots == got.prefix_cached_slots, f"prefix caching should share as fork does: {got}"
    assert round(100 * (1 - got.shared_slots / got.unshared_slots)) == 70, got


def test_shared_prompt_copy_on_write(impl):
    """One 200-token prompt with 4 answers of 100 tokens, block 16: 76 blocks unshared, 40 shared; the shared
    partial last block is copied by the first three answers and written in place by the fourth."""
    got = shared_prompt_answers(impl, prompt=200, answers=4, output=100, block_size=16)
    assert (got.unshared_blocks, got.shared_blocks) == (76, 40), got
    assert got.copied_by == [True, True, True, False], got


def test_waste_per_request_is_half_a_block(impl):
    """Block sizes 1, 16, 256, each over requests of 2B + 1 .. 3B tokens (every residue mod B once, three blocks
    each): the mean waste (allocated minus stored slots) is exactly (block - 1) / 2 tokens per request."""
    for block_size in (1, 16, 256):
        waste = block_size_waste(impl, block_size, lengths=range(2 * block_size + 1, 3 * block_size + 1))
        assert waste == (block_size - 1) / 2, f"block {block_size}: mean waste {waste} tokens per request"


@example(EvictionProgram(2, 1, (("use", 0), ("use", 1), ("use", 2), ("use", 0), ("use", 1))))  # evicts the MRU
@example(EvictionProgram(2, 1, (("use", 0), ("use", 1), ("lookup", 0), ("use", 2), ("use", 1))))  # lookup touches
@example(EvictionProgram(2, 1, (("use", 0), ("use", 1), ("too_big", 0), ("use", 2), ("use", 1))))  # a refused
@example(EvictionProgram(3, 1, (("hold", 0), ("use", 1), ("swap", 0), ("use", 2), ("use", 3))))  # swap_out releases
@given(program=eviction_programs())
def test_evicts_least_recently_used(impl, program):
    """Idle cached blocks are evicted least recently used first, swap_out releases a block as free does, and neither
    lookup_prefix nor an allocate that runs out changes the order: on distinct one-block prompts, whether each
    allocate and lookup finds its prompt cached follows from a shadow LRU list.  After every step every prompt is
    looked up (in a fixed order, which a lookup that moves blocks would impose)."""
    B = program.block_size
    m = open_manager(impl, program.num_blocks, B, NullStorage(), num_cpu_blocks=len(program.steps))
    idle: list[int] = []  # prompts whose block is cached and idle, least recently used first
    evicted: list[int] = []
    refs = collections.Counter()  # prompt -> live resident sequences holding it
    never_used = program.num_blocks  # blocks that never held a prompt: taken before a cached block is evicted
    held: list[tuple[int, int]] = []  # (sequence, prompt)
    done: list[tuple[str, int]] = []

    def expect(what, got, prompt):
        want = B if refs[prompt] or prompt in idle else 0
        assert got == want, (f"after {done}, each step followed by a lookup_prefix of every prompt: {what} found "
                             f"{got} tokens cached, expected {want}: idle cached blocks are evicted least recently "
                             f"used first (swap_out releasing as free does), and neither lookup_prefix nor an "
                             f"allocate raising OutOfBlocks changes the order, so the cached idle prompts are {idle} "
                             f"(least recently used first), evicted {evicted}")

    def allocate(prompt):
        nonlocal never_used
        sid = len(done)
        expect(f"allocate({sid}, {[prompt] * B})", m.allocate(sid, [prompt] * B), prompt)
        if prompt in idle:
            idle.remove(prompt)
        elif not refs[prompt]:
            if never_used:
                never_used -= 1
            else:
                evicted.append(idle.pop(0))
        refs[prompt] += 1
        return sid, prompt

    def release(prompt):
        refs[prompt] -= 1
        if not refs[prompt]:
            idle.append(prompt)

    for kind, x in program.steps:
        done.append((kind, x))
        if kind == "lookup":
            expect(f"lookup_prefix({[x] * B})", m.lookup_prefix([x] * B), x)
        elif kind == "use":
            sid, prompt = allocate(x)
            m.free(sid)
            release(prompt)
        elif kind == "hold":
            held.append(allocate(x))
        elif kind == "too_big":  # its first block is prompt x's; the rest, a token no prompt uses, overflows the pool
            with pytest.raises(OutOfBlocks):
                m.allocate(len(done), [x] * B + [program.num_prompts] * (program.num_blocks * B))
        else:
            sid, prompt = held.pop(x)
            (m.free if kind == "free" else m.swap_out)(sid)
            release(prompt)
        for prompt in range(program.num_prompts):
            expect(f"lookup_prefix({[prompt] * B})", m.lookup_prefix([prompt] * B), prompt)


def test_rejects_bad_input(impl):
    """Bad geometry (a pool past MAX_BLOCKS: rejected naming the argument and the limit, or handled lazily), unknown
    or duplicate sequence ids, and calls that need a resident sequence on a swapped-out one (or swap_in on a resident
    one) raise errors naming the argument, and change nothing.  (The state machine makes such calls at every point
    of its programs and checks every observable.)"""
    for args, name in (((0, 0), "block_size"), ((-1, 4), "num_blocks")):
        assert_rejected(impl, f"{name} out of range", *args, NullStorage(), names=(name,))
    for name, args, kwargs in (("num_blocks", (10**10, 4), {}), ("num_cpu_blocks", (4, 4), {"num_cpu_blocks": 10**10})):
        huge_pool(impl, name, args, kwargs)
    m = open_manager(impl, 4, 2, NullStorage())
    m.allocate(1, [1, 2, 3])
    for call, name in ((lambda: m.allocate(1, [1]), "seq_id"), (lambda: m.allocate(2, []), "tokens"),
                       (lambda: m.fork(1, 1), "child_id"), (lambda: m.append(7, 1), "seq_id"),
                       (lambda: m.append(1, 2.5), "token"), (lambda: m.allocate(3, [1, "a"]), "tokens"),
                       (lambda: m.ref_count(-1), "block"), (lambda: m.ref_count(4), "block")):
        with pytest.raises((ValueError, TypeError, KeyError), match=rf"\b{name}\b"):  # the argument as a word
            call()
    assert m.num_tokens(1) == 3, "a rejected append changed the sequence"

    m = open_manager(impl, 4, 2, NullStorage(), num_cpu_blocks=4)
    m.allocate(1, [1, 2, 3])
    m.allocate(2, [1, 2])
    m.swap_out(2)
    pools = (m.num_free_blocks(), m.num_free_cpu_blocks(), m.block_table(1), m.block_table(2))
    for case, method, args, names in (("append to a swapped-out sequence", m.append, (2, 1), ("seq_id",)),
                                      ("fork of a swapped-out sequence", m.fork, (2, 3), ("parent_id", "seq_id")),
                                      ("swap_out of a swapped-out sequence", m.swap_out, (2,), ("seq_id",)),
                                      ("swap_in of a resident sequence", m.swap_in, (1,), ("seq_id",))):
        assert_rejected(impl, case, *args, names=names, method=method)
    assert (m.num_tokens(2), m.is_swapped(2), m.is_swapped(1)) == (2, True, False), "a rejected call changed a sequence"
    assert (m.num_free_blocks(), m.num_free_cpu_blocks(), m.block_table(1), m.block_table(2)) == pools, (
        "a rejected call changed the pools or the block tables")
    with pytest.raises((ValueError, KeyError), match=r"\bseq_id\b"):
        m.num_tokens(3)  # the rejected fork made no child


def huge_pool(impl: Impl, name: str, args: tuple, kwargs: dict) -> None:
    """A pool of 10**10 blocks: a ValueError/TypeError naming ``name`` and MAX_BLOCKS, or a manager that works at
    that size (one whose set-up is linear in the pool runs past the per-call limit: a hang verdict)."""
    case = f"a pool of 10**10 blocks ({name})"
    try:
        m = guarded_call(impl.fn, *args, NullStorage(), timeout_s=call_limit(impl), hang_owner=impl.fn, **kwargs)
    except ContractViolation as exc:
        cause = exc.__cause__
        assert isinstance(cause, ValueError | TypeError), f"{impl.name} ({case}): {exc}, not a ValueError/TypeError"
        assert names_argument(str(cause), name), f"{impl.name} ({case}): '{cause}' does not name {name}"
        assert str(MAX_BLOCKS) in str(cause) or "2**20" in str(cause), (
            f"{impl.name} ({case}): '{cause}' does not state the limit MAX_BLOCKS = 2**20 = {MAX_BLOCKS}")
        return
    del m  # built in time: handled lazily, so it must work at that size
    lazy = open_manager(impl, *args, NullStorage(), **kwargs)
    num_blocks, num_cpu_blocks = args[0], kwargs.get("num_cpu_blocks", 0)
    assert (lazy.num_free_blocks(), lazy.num_free_cpu_blocks()) == (num_blocks, num_cpu_blocks), (
        f"{impl.name} ({case}): free counts {lazy.num_free_blocks(), lazy.num_free_cpu_blocks()}")
    lazy.allocate(1, [0] * 9)  # three blocks of 4
    if num_cpu_blocks:
        lazy.swap_out(1)
        assert lazy.num_free_cpu_blocks() == num_cpu_blocks - 3, f"{impl.name} ({case}): swap_out of 3 blocks"
        lazy.swap_in(1)
    assert lazy.num_free_blocks() == num_blocks - 3, f"{impl.name} ({case}): {lazy.num_free_blocks()} free holding 3"
    assert lazy.ref_count(num_blocks - 1) in (0, 1), f"{impl.name} ({case}): the last block's count"


test_machine_bookkeeping.is_hypothesis_test = True
test_machine_data.is_hypothesis_test = True
