"""Properties of block managers (contract: harness/contracts/block_manager.py).

A Hypothesis state machine drives a manager with small pools -- allocate (prefix-cache lookups
included), append, fork, free, look up, preempt by recompute and resume, swap out and in -- against a
shadow model that knows only each live sequence's tokens.  The caller's storage plays the model:
the KV it writes for token i of a sequence is the sequence's whole prefix tokens[:i+1], so a block
reused under the wrong prefix reads back wrong.  The same machine backs two properties that check
different invariants after every step, so each mutant is killed for the reason it declares:
``machine_bookkeeping`` (pool conservation, reference counts = block-table entries, honest
out-of-memory, a whole pool after freeing everything) and ``machine_data`` (what each sequence reads
through its block table is its shadow, no write into a block whose count exceeds one).  Both replay the
pinned programs (PINNED) first.  The order in which idle cached blocks are evicted depends on choices the
contract leaves open once sequences share and duplicate blocks, so ``evicts_least_recently_used`` checks
it on one-block prompts, where it is exact.
"""

import collections
import functools

import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness.contracts.block_manager import NullStorage, OutOfBlocks, open_manager
from harness.guard import ContractViolation, assert_rejected
from harness.registry import Impl
from harness.simulator.examples import block_size_waste, parallel_sampling, shared_prompt_answers
from harness.strategies.block_manager import (
    EvictionProgram,
    PoolGeometry,
    appended_tokens,
    eviction_programs,
    pool_geometries,
    prompts,
)

TECHNIQUE = "block_manager"


class ShadowStorage:
    """The caller's KV storage: slots hold the prefix each token's KV was computed from; None = never written."""

    def __init__(self, geometry: PoolGeometry, kv_of):
        B = geometry.block_size
        self.gpu = [[None] * B for _ in range(geometry.num_blocks)]
        self.cpu = [[None] * B for _ in range(geometry.num_cpu_blocks)]
        self.kv_of, self.ref_count, self.violations = kv_of, None, []
        self.writes = 0  # token KVs computed so far: allocate must compute exactly those it did not find cached

    def _into(self, pool, block, what):
        if not (isinstance(block, int) and 0 <= block < len(pool)):
            raise ContractViolation(f"{what}: block {block!r} is outside the pool of {len(pool)}")
        if pool is self.gpu and self.ref_count(block) > 1:
            self.violations.append(f"{what} into block {block} whose reference count is {self.ref_count(block)}")
        return pool[block]

    def write(self, block, offset, seq_id, position):
        self._into(self.gpu, block, "write")[offset] = self.kv_of(seq_id, position)
        self.writes += 1

    def copy(self, src, dst):
        self._into(self.gpu, dst, "copy")[:] = self.gpu[src]

    def swap_out(self, gpu_block, cpu_block):
        self._into(self.cpu, cpu_block, "swap_out")[:] = self.gpu[gpu_block]

    def swap_in(self, cpu_block, gpu_block):
        self._into(self.gpu, gpu_block, "swap_in")[:] = self.cpu[cpu_block]


def step(fn):
    """A rule or invariant that marks the run failed when it raises: Hypothesis runs teardown() in a finally, and
    teardown's own checks (a whole pool after freeing everything) would replace the first failure's message."""

    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except BaseException:
            self.failed = True
            raise

    return run


def machine_for(impl: Impl, checks: frozenset[str]):
    class BlockManagerMachine(RuleBasedStateMachine):
        failed = False  # a rule or invariant raised: teardown checks nothing

        @initialize(geometry=pool_geometries())
        @step
        def build(self, geometry):
            self.g, self.B = geometry, geometry.block_size
            self.storage = ShadowStorage(geometry, lambda sid, pos: tuple(self.shadow[sid][:pos + 1]))
            self.m = open_manager(impl, geometry.num_blocks, self.B, self.storage,
                                  num_cpu_blocks=geometry.num_cpu_blocks)
            self.storage.ref_count = self.m.ref_count
            self.shadow: dict[int, list[int]] = {}  # live sequence -> its tokens
            self.swapped: set[int] = set()
            self.preempted: dict[int, list[int]] = {}  # preempted by recompute -> tokens to recompute
            self.history: list[list[int]] = []
            self.given: list[tuple[list[int], tuple[int, ...]]] = []  # lists handed to the manager, as handed
            self.next_id = 0

        def hand(self, tokens) -> list[int]:
            """A fresh list for the manager, remembered: a manager that keeps it and appends to it (aliasing the
            caller's prompt) shows up in `bookkeeping`."""
            self.given.append((mine := list(tokens), tuple(tokens)))
            return mine

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
            return sorted(set(self.shadow) - self.swapped)

        def sources(self) -> list[list[int]]:
            """What prompts derive from: the 8 most recent prompts and the tokens of 8 live sequences (grown by
            appends, copied by forks), so blocks duplicated by appends, hash chains through appended blocks and a
            fork's diverged tails are looked up again.  A bounded choice keeps shrinking a failing program cheap
            (the stale-count mutant's kill took 29 s -> 10 s of CPU)."""
            return self.history[-8:] + [list(self.shadow[s]) for s in sorted(self.shadow)[-8:]]

        # ---- steps, with explicit arguments: the rules draw them, pinned programs (PINNED) name them
        def do_allocate(self, tokens, sid=None):
            if sid is None:
                self.next_id += 1
                sid = self.next_id
            self.shadow[sid] = list(tokens)
            free, writes = self.m.num_free_blocks(), self.storage.writes
            promised = self.m.lookup_prefix(self.hand(tokens))
            try:
                cached = self.m.allocate(sid, self.hand(tokens))
            except OutOfBlocks:
                del self.shadow[sid]
                need = self.most_needed(tokens, promised)
                assert free < need, (f"allocate of {len(tokens)} tokens ({promised} of them cached) raised "
                                     f"OutOfBlocks with {free} blocks free; it needs at most {need}")
                return False
            assert cached % self.B == 0 and 0 <= cached <= len(tokens), f"allocate reported {cached} cached"
            if "bookkeeping" in checks:  # the simulator counts recomputed tokens from these two numbers
                assert cached == promised, f"lookup_prefix promised {promised} tokens, allocate reported {cached}"
                computed = self.storage.writes - writes
                assert computed == len(tokens) - cached, (
                    f"allocate reported {cached} of {len(tokens)} tokens cached but computed {computed}")
            self.history.append(list(tokens))
            return True

        def most_needed(self, tokens, promised) -> int:
            """The most free blocks allocating ``tokens`` can take: one per block not cached, plus one per cached
            block that may be idle (it leaves the free pool).  A cached block holds its prefix's KV, so it is one
            of the GPU blocks whose storage holds that; when every such block is in use, the hit is too."""
            B, gpu = self.B, self.storage.gpu
            need = -(-len(tokens) // B) - promised // B
            for i in range(promised // B):
                kv = [tuple(tokens[:i * B + j + 1]) for j in range(B)]
                holders = [b for b in range(len(gpu)) if gpu[b] == kv]
                need += not holders or any(self.m.ref_count(b) == 0 for b in holders)
            return need

        def do_append(self, sid, tokens):
            """Append token by token; one that needs a block (a new one, or a copy of a shared last block) with
            none free must raise OutOfBlocks, and only such a one may."""
            for token in tokens:
                n, last = len(self.shadow[sid]), self.table(sid)[-1]
                need = ("a new block" if n % self.B == 0 else
                        f"a copy of its shared last block {last}" if self.m.ref_count(last) > 1 else None)
                free = self.m.num_free_blocks()
                self.shadow[sid].append(token)
                try:
                    self.m.append(sid, token)
                except OutOfBlocks:
                    self.shadow[sid].pop()
                    assert need and free == 0, (f"append to sequence {sid} raised OutOfBlocks with {free} blocks "
                                                f"free, needing {need or 'no block'}")
                    return
                except Exception as exc:
                    if need and free == 0:
                        raise AssertionError(f"append to sequence {sid} needed {need} with no block free and raised "
                                             f"{type(exc).__name__}: {exc}, not OutOfBlocks") from exc
                    raise
                assert not (need and free == 0), (f"append to sequence {sid} needed {need} with no block free "
                                                  "and did not raise OutOfBlocks")

        def do_fork(self, parent, then=()):
            self.next_id += 1
            self.m.fork(parent, self.next_id)
            self.shadow[self.next_id] = list(self.shadow[parent])
            self.do_append(self.next_id, then)

        def do_free(self, sid):
            self.m.free(sid)
            del self.shadow[sid]
            self.swapped.discard(sid)

        def do_preempt(self, sid):
            self.m.free(sid)
            self.preempted[sid] = self.shadow.pop(sid)

        def do_resume(self, sid):
            if self.do_allocate(self.preempted[sid], sid):
                del self.preempted[sid]

        def do_lookup(self, tokens):
            cached = self.m.lookup_prefix(self.hand(tokens))
            assert cached % self.B == 0 and 0 <= cached <= len(tokens), f"lookup_prefix reported {cached}"

        def do_swap_out(self, sid):
            cpu_free, need = self.m.num_free_cpu_blocks(), len(self.table(sid))
            try:
                self.m.swap_out(sid)
            except OutOfBlocks:
                assert cpu_free < need, f"swap_out raised OutOfBlocks with {cpu_free} CPU blocks free for {need}"
                return
            self.swapped.add(sid)

        def do_swap_in(self, sid):
            free, need = self.m.num_free_blocks(), len(self.table(sid))
            try:
                self.m.swap_in(sid)
            except OutOfBlocks:
                assert free < need, f"swap_in raised OutOfBlocks with {free} blocks free for {need}"
                return
            self.swapped.discard(sid)

        # ---- rules
        def tokens(self, data, sid, label, min_size):
            return data.draw(appended_tokens(self.shadow[sid], self.sources(), self.B, min_size), label=label)

        @rule(data=st.data())
        @step
        def allocate(self, data):
            self.do_allocate(data.draw(prompts(self.sources(), self.B), label="tokens"))

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
            """Fork, then append to the child: its first token copies a shared partial last block."""
            parent = data.draw(st.sampled_from(self.resident()), label="fork")
            self.do_fork(parent, self.tokens(data, parent, "child appends", 0))

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
            used = sum(c > 0 for c in counts)
            assert self.m.num_free_blocks() + used == n, (
                f"free {self.m.num_free_blocks()} + used {used} != pool size {n}")
            cpu_used = {b for sid in self.swapped for b in tables[sid]}
            assert self.m.num_free_cpu_blocks() + len(cpu_used) == self.g.num_cpu_blocks, (
                f"CPU pool: free {self.m.num_free_cpu_blocks()} + used {len(cpu_used)} != {self.g.num_cpu_blocks}")

        @invariant()
        @step
        def data_reads_back(self):
            if "data" not in checks or not hasattr(self, "m"):
                return
            assert not self.storage.violations, self.storage.violations[0]
            for sid, tokens in self.shadow.items():
                pool = self.storage.cpu if self.m.is_swapped(sid) else self.storage.gpu
                table = self.table(sid)
                for i in range(len(tokens)):
                    got, want = pool[table[i // self.B]][i % self.B], tuple(tokens[:i + 1])
                    assert got == want, (f"sequence {sid} reads token {i} through block {table[i // self.B]} "
                                         f"as the KV of {got}, expected {want}")

        def teardown(self):
            if "bookkeeping" not in checks or not hasattr(self, "m") or self.failed:
                return
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
    # allocate's capacity check counting a cached prefix held by a live sequence as new blocks (vLLM v0)
    "oob_ignores_hits": (PoolGeometry(2, 3, 0), [("allocate", [0, 0]), ("allocate", [1, 1]), ("allocate", [0, 0, 2])]),
}


def replay_pinned(impl: Impl, checks: frozenset[str]) -> None:
    machine_class = machine_for(impl, checks)
    for name, (geometry, program) in PINNED.items():
        machine = machine_class()
        try:
            machine.build(geometry)
            for op, *args in program:
                getattr(machine, f"do_{op}")(*args)
                machine.bookkeeping()
                machine.data_reads_back()
        except BaseException as exc:
            machine.failed = True
            exc.add_note(f"pinned program {name!r} on {geometry}: {program}")
            raise
        finally:
            machine.teardown()


def run_machine(impl: Impl, checks: frozenset[str]) -> None:
    """Replay the pinned programs, then run under the loaded profile, minus the explain phase: on a failing machine
    it replays the whole program once per step and took ~55 s of the ~57 s a kill cost (shrinking itself: ~1 s)."""
    replay_pinned(impl, checks)
    profile = settings.default
    run_state_machine_as_test(machine_for(impl, checks),
                              settings=settings(profile, phases=[p for p in profile.phases if p != Phase.explain]))


def test_machine_bookkeeping(impl):
    """Pool conservation, reference counts = block-table entries, declared out-of-memory, pool whole at the end."""
    run_machine(impl, frozenset({"bookkeeping"}))


def test_machine_data(impl):
    """Every live sequence reads its own tokens' KV through its block table; no write lands in a shared block."""
    run_machine(impl, frozenset({"data"}))


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
    """Block sizes 1, 16, 256 over lengths covering every residue mod 256 equally: the mean waste (allocated
    minus stored slots) is exactly (block - 1) / 2 tokens per request."""
    for block_size in (1, 16, 256):
        waste = block_size_waste(impl, block_size, lengths=range(1000, 1256))
        assert waste == (block_size - 1) / 2, f"block {block_size}: mean waste {waste} tokens per request"


@example(EvictionProgram(2, 1, (("use", 0), ("use", 1), ("use", 2), ("use", 0), ("use", 1))))  # evicts the MRU
@example(EvictionProgram(2, 1, (("use", 0), ("use", 1), ("lookup", 0), ("use", 2), ("use", 1))))  # lookup touches
@given(program=eviction_programs())
def test_evicts_least_recently_used(impl, program):
    """Idle cached blocks are evicted least recently used first, and lookup_prefix changes nothing: on distinct
    one-block prompts, whether each allocate and lookup finds its prompt cached follows from a shadow LRU list.
    After every step every prompt is looked up (in a fixed order, which a lookup that moves blocks would impose)."""
    B = program.block_size
    m = open_manager(impl, program.num_blocks, B, NullStorage())
    idle: list[int] = []  # prompts whose block is cached and idle, least recently used first
    evicted: list[int] = []
    refs = collections.Counter()  # prompt -> live sequences holding it
    never_used = program.num_blocks  # blocks that never held a prompt: taken before a cached block is evicted
    held: list[tuple[int, int]] = []  # (sequence, prompt)
    done: list[tuple[str, int]] = []

    def expect(what, got, prompt):
        want = B if refs[prompt] or prompt in idle else 0
        assert got == want, (f"after {done}, each step followed by a lookup_prefix of every prompt: {what} found "
                             f"{got} tokens cached, expected {want}: idle cached blocks "
                             f"are evicted least recently used first and lookup_prefix changes nothing, so the "
                             f"cached idle prompts are {idle} (least recently used first), evicted {evicted}")

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

    def free(sid, prompt):
        m.free(sid)
        refs[prompt] -= 1
        if not refs[prompt]:
            idle.append(prompt)

    for kind, x in program.steps:
        done.append((kind, x))
        if kind == "lookup":
            expect(f"lookup_prefix({[x] * B})", m.lookup_prefix([x] * B), x)
        elif kind == "use":
            free(*allocate(x))
        elif kind == "hold":
            held.append(allocate(x))
        else:
            free(*held.pop(x))
        for prompt in range(program.num_prompts):
            expect(f"lookup_prefix({[prompt] * B})", m.lookup_prefix([prompt] * B), prompt)


def test_rejects_bad_input(impl):
    """Bad geometry, unknown or duplicate sequence ids, and calls that need a resident sequence on a swapped-out
    one (or swap_in on a resident one) raise errors naming the argument, and change nothing."""
    for args, name in (((0, 0), "block_size"), ((-1, 4), "num_blocks")):
        assert_rejected(impl, f"{name} out of range", *args, NullStorage(), names=(name,))
    m = open_manager(impl, 4, 2, NullStorage())
    m.allocate(1, [1, 2, 3])
    for call, name in ((lambda: m.allocate(1, [1]), "seq_id"), (lambda: m.allocate(2, []), "tokens"),
                       (lambda: m.fork(1, 1), "child_id"), (lambda: m.append(7, 1), "seq_id"),
                       (lambda: m.append(1, 2.5), "token"), (lambda: m.allocate(3, [1, "a"]), "tokens"),
                       (lambda: m.ref_count(-1), "block"), (lambda: m.ref_count(4), "block")):
        with pytest.raises((ValueError, KeyError), match=rf"\b{name}\b"):  # the argument as a word
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
