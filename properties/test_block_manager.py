"""Properties of block managers (contract: harness/contracts/block_manager.py).

Two properties run the state machine of properties/block_manager_machine.py, each checking its own laws after every
step, so each mutant is killed for the reason it declares: ``machine_bookkeeping`` (pool conservation, reference
counts = block-table entries, honest out-of-memory, every observable unchanged by a call that raises, the accepted
calls replayed on a fresh manager make the same storage calls, a whole pool after freeing everything) and
``machine_data`` (what each sequence reads through its block table is the KV of its own prefix, no write into a
block whose count exceeds one).  Both replay the pinned programs (PINNED) first.  The order in which idle cached
blocks are evicted depends on choices the contract leaves open once sequences share and duplicate blocks, so
``evicts_least_recently_used`` checks it on one-block prompts, where it is exact; ``large_tables`` runs one program on
tables past 256, 512 and 1,024 blocks; the worked examples compute the vLLM paper's savings through the manager.
"""

import collections

import hypothesis
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis.stateful import run_state_machine_as_test

from llm_inference_harness.analytic.simulator.examples import block_size_waste, parallel_sampling, shared_prompt_answers
from llm_inference_harness.contracts.block_manager import (
    MAX_BLOCKS,
    CountingStorage,
    NullStorage,
    OutOfBlocks,
    open_manager,
)
from llm_inference_harness.engine.guard import (
    ContractViolation,
    assert_rejected,
    call_limit,
    guarded_call,
    names_argument,
)
from llm_inference_harness.engine.registry import Impl
from llm_inference_harness.properties.block_manager_machine import machine_for
from llm_inference_harness.strategies.block_manager import (
    TOKEN_ALPHABET,
    EvictionProgram,
    PoolGeometry,
    eviction_programs,
)

TECHNIQUE = "block_manager"

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
    # an allocate rejected for a live seq_id that has already taken its cache hits (a random program reaches this only
    # when a rejected call reuses a live id whose tokens are cached: the kill at one seed rested on it)
    "hits_before_id_check": (PoolGeometry(2, 4, 0), [
        ("allocate", [0, 1, 2]), ("allocate", [0, 1]),
        ("reject", "allocate under a live seq_id (its own tokens: cache hits)", "allocate", ("seq_id",), 2, [0, 1])]),
}


def run_program(impl: Impl, geometry: PoolGeometry, program, checks=frozenset({"bookkeeping", "data"})) -> None:
    """One program, step by step (``("allocate", tokens)``, ``("append", sid, tokens)``, ...: the machine's do_*),
    every invariant after every step, and the teardown's checks."""
    machine = machine_for(impl, checks)()
    try:
        machine.open(geometry)
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
    invariants, and shrinking each took a kill from ~20 s to ~700 s), from ``seed`` if given (else a derandomized
    profile seeds from the machine's name, `machine_for`); ``reached`` collects each program's situations."""
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


def test_next_turn_reuses_the_answer(impl):
    """A chat's next turn sends the prompt and the answer back with a new question: 100 prompt tokens and 60 decoded,
    block 16, then 160 + 40 tokens: the 10 full blocks of the first turn (6 of the prompt, 4 filled by decoding) are
    found cached, 160 tokens, and only the 40 new ones are computed."""
    storage = CountingStorage()
    m = open_manager(impl, 32, 16, storage)
    prompt, answer = [(7 * i) % 101 for i in range(100)], [(3 * i + 1) % 101 for i in range(60)]
    m.allocate(1, prompt)
    for token in answer:
        m.append(1, token)
    m.free(1)
    computed = storage.writes
    cached = m.allocate(2, prompt + answer + [5] * 40)
    assert (cached, storage.writes - computed) == (160, 40), (
        f"the next turn found {cached} tokens cached and computed {storage.writes - computed}")


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
