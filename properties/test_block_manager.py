"""Properties of block managers (contract: harness/contracts/block_manager.py).

A Hypothesis state machine drives a manager with small pools -- allocate (prefix-cache lookups
included), append, fork, free, look up, preempt by recompute and resume, swap out and in -- against a
shadow model that knows only each live sequence's tokens.  The caller's storage plays the model:
the KV it writes for token i of a sequence is the sequence's whole prefix tokens[:i+1], so a block
reused under the wrong prefix reads back wrong.  The same machine backs two properties that check
different invariants after every step, so each mutant is killed for the reason it declares:
``machine_bookkeeping`` (pool conservation, reference counts = block-table entries, honest
out-of-memory, a whole pool after freeing everything) and ``machine_data`` (what each sequence reads
through its block table is its shadow, no write into a block whose count exceeds one).
"""

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness.contracts.block_manager import OutOfBlocks, open_manager
from harness.guard import ContractViolation, assert_rejected
from harness.registry import Impl
from harness.simulator.examples import block_size_waste, parallel_sampling, shared_prompt_answers
from harness.strategies import TOKEN_ALPHABET, PoolGeometry, pool_geometries, prompts

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


def machine_for(impl: Impl, checks: frozenset[str]):
    class BlockManagerMachine(RuleBasedStateMachine):
        @initialize(geometry=pool_geometries())
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
            self.given.append((given := list(tokens), tuple(tokens)))
            return given

        def resident(self):
            return sorted(set(self.shadow) - self.swapped)

        def _allocate(self, sid, tokens):
            self.shadow[sid] = list(tokens)
            free, writes = self.m.num_free_blocks(), self.storage.writes
            promised = self.m.lookup_prefix(self.hand(tokens))
            try:
                cached = self.m.allocate(sid, self.hand(tokens))
            except OutOfBlocks:
                del self.shadow[sid]
                assert free < -(-len(tokens) // self.B), f"allocate raised OutOfBlocks with {free} blocks free"
                return False
            except BaseException:
                del self.shadow[sid]  # not allocated: teardown must not free it and hide this error behind its own
                raise
            assert cached % self.B == 0 and 0 <= cached <= len(tokens), f"allocate reported {cached} cached"
            if "bookkeeping" in checks:  # the simulator counts recomputed tokens from these two numbers
                assert cached == promised, f"lookup_prefix promised {promised} tokens, allocate reported {cached}"
                computed = self.storage.writes - writes
                assert computed == len(tokens) - cached, (
                    f"allocate reported {cached} of {len(tokens)} tokens cached but computed {computed}")
            self.history.append(list(tokens))
            return True

        # Prompts derive from the 8 most recent ones: enough to share and collide, and a bounded choice
        # keeps shrinking a failing program cheap (the stale-count mutant's kill took 29 s -> 10 s of CPU).
        @rule(data=st.data())
        def allocate(self, data):
            tokens = data.draw(prompts(self.history[-8:], self.B), label="tokens")
            self.next_id += 1
            self._allocate(self.next_id, tokens)

        @precondition(lambda self: self.preempted)
        @rule(data=st.data())
        def resume_preempted(self, data):
            sid = data.draw(st.sampled_from(sorted(self.preempted)), label="resume")
            if self._allocate(sid, self.preempted[sid]):
                del self.preempted[sid]

        @precondition(lambda self: self.resident())
        @rule(data=st.data(), token=st.integers(0, TOKEN_ALPHABET - 1))
        def append(self, data, token):
            sid = data.draw(st.sampled_from(self.resident()), label="append to")
            self.shadow[sid].append(token)
            free = self.m.num_free_blocks()
            try:
                self.m.append(sid, token)
            except OutOfBlocks:
                self.shadow[sid].pop()
                assert free == 0, f"append raised OutOfBlocks with {free} blocks free"

        @precondition(lambda self: self.resident())
        @rule(data=st.data())
        def fork(self, data):
            parent = data.draw(st.sampled_from(self.resident()), label="fork")
            self.next_id += 1
            self.m.fork(parent, self.next_id)
            self.shadow[self.next_id] = list(self.shadow[parent])

        @precondition(lambda self: self.shadow)
        @rule(data=st.data())
        def free(self, data):
            sid = data.draw(st.sampled_from(sorted(self.shadow)), label="free")
            self.m.free(sid)
            del self.shadow[sid]
            self.swapped.discard(sid)

        @precondition(lambda self: self.resident())
        @rule(data=st.data())
        def preempt_by_recompute(self, data):
            sid = data.draw(st.sampled_from(self.resident()), label="preempt")
            self.m.free(sid)
            self.preempted[sid] = self.shadow.pop(sid)

        @precondition(lambda self: self.history)
        @rule(data=st.data())
        def lookup_prefix(self, data):
            tokens = data.draw(prompts(self.history[-8:], self.B), label="lookup")
            cached = self.m.lookup_prefix(self.hand(tokens))
            assert cached % self.B == 0 and 0 <= cached <= len(tokens), f"lookup_prefix reported {cached}"

        @precondition(lambda self: self.resident())
        @rule(data=st.data())
        def swap_out(self, data):
            sid = data.draw(st.sampled_from(self.resident()), label="swap out")
            cpu_free, need = self.m.num_free_cpu_blocks(), len(self.m.block_table(sid))
            try:
                self.m.swap_out(sid)
            except OutOfBlocks:
                assert cpu_free < need, f"swap_out raised OutOfBlocks with {cpu_free} CPU blocks free for {need}"
                return
            self.swapped.add(sid)

        @precondition(lambda self: self.swapped)
        @rule(data=st.data())
        def swap_in(self, data):
            sid = data.draw(st.sampled_from(sorted(self.swapped)), label="swap in")
            free, need = self.m.num_free_blocks(), len(self.m.block_table(sid))
            try:
                self.m.swap_in(sid)
            except OutOfBlocks:
                assert free < need, f"swap_in raised OutOfBlocks with {free} blocks free for {need}"
                return
            self.swapped.discard(sid)

        # ---- invariants
        @invariant()
        def bookkeeping(self):
            if "bookkeeping" not in checks or not hasattr(self, "m"):
                return
            for given, handed in self.given:
                assert tuple(given) == handed, (f"the token list {list(handed)} handed to allocate/lookup_prefix "
                                                f"became {given}: the manager kept the caller's list and changed it")
            n = self.g.num_blocks
            entries = [0] * n
            for sid, tokens in self.shadow.items():
                table = self.m.block_table(sid)
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
            cpu_used = {b for sid in self.swapped for b in self.m.block_table(sid)}
            assert self.m.num_free_cpu_blocks() + len(cpu_used) == self.g.num_cpu_blocks, (
                f"CPU pool: free {self.m.num_free_cpu_blocks()} + used {len(cpu_used)} != {self.g.num_cpu_blocks}")

        @invariant()
        def data_reads_back(self):
            if "data" not in checks or not hasattr(self, "m"):
                return
            assert not self.storage.violations, self.storage.violations[0]
            for sid, tokens in self.shadow.items():
                pool = self.storage.cpu if self.m.is_swapped(sid) else self.storage.gpu
                table = self.m.block_table(sid)
                for i in range(len(tokens)):
                    got, want = pool[table[i // self.B]][i % self.B], tuple(tokens[:i + 1])
                    assert got == want, (f"sequence {sid} reads token {i} through block {table[i // self.B]} "
                                         f"as the KV of {got}, expected {want}")

        def teardown(self):
            if "bookkeeping" not in checks or not hasattr(self, "m"):
                return
            for sid in list(self.shadow):
                self.m.free(sid)
            n = self.g.num_blocks
            assert self.m.num_free_blocks() == n, f"after freeing everything {self.m.num_free_blocks()} of {n} free"
            assert all(self.m.ref_count(b) == 0 for b in range(n)), "after freeing everything a count is not 0"
            assert self.m.num_free_cpu_blocks() == self.g.num_cpu_blocks, "after freeing everything CPU blocks leak"

    BlockManagerMachine.__name__ = f"BlockManagerMachine[{impl.name}]"
    return BlockManagerMachine


def run_machine(impl: Impl, checks: frozenset[str]) -> None:
    """Run under the loaded profile, minus the explain phase: on a failing machine it replays the whole
    program once per step and took ~55 s of the ~57 s a kill cost (shrinking itself: ~1 s)."""
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
# worked examples (vLLM paper Sec. 4.4 and the seeds), computed through the manager
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


def test_rejects_bad_input(impl):
    """Bad geometry and unknown or duplicate sequence ids raise errors naming the argument."""
    from harness.contracts.block_manager import NullStorage

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
