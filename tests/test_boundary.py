"""The boundary between the judge and the implementation's process (harness/engine/): what crosses it, and what
happens to the implementation's process when the judge goes."""

import contextlib
import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from llm_inference_harness.engine import wire

ROOT = Path(__file__).resolve().parents[1]


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_harness_takes_the_judge_and_the_implementation_along(tmp_path):
    """SIGKILL of `harness check` (no handler runs) still ends its judge and the implementation's process: each
    was started with PR_SET_PDEATHSIG, the kernel's guarantee, not the harness's cleanup."""
    plugin = tmp_path / "sleeps.py"
    plugin.write_text(textwrap.dedent("""
        import time

        from llm_inference_harness import declare


        @declare(caps={"call_limit_s": 600})
        def attention(q, k, v, *, causal=False, scale=None):
            time.sleep(600)
    """))
    cli = subprocess.Popen([sys.executable, "-m", "llm_inference_harness", "check", "attention",
                            "--plugin", f"{plugin}:attention", "--property", "matches_reference", "--jobs", "1"],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    tree: set[int] = set()
    while time.monotonic() < deadline and len(tree) < 2:  # the judge, and the implementation's process below it
        time.sleep(0.2)
        tree = _descendants(cli.pid)
    assert len(tree) >= 2, f"the check never started its judge and the implementation's process: {tree}"
    time.sleep(1.0)  # the implementation is in its call now
    tree = _descendants(cli.pid)
    cli.kill()
    cli.wait()
    end = time.monotonic() + 10
    while time.monotonic() < end and any(_alive(p) for p in tree):
        time.sleep(0.1)
    assert not [p for p in tree if _alive(p)], "processes of a killed harness live on"


def test_the_judge_resolves_no_global_from_the_implementation():
    """A pickle that would call a function when read (the classic exploit) is refused before anything runs."""

    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with pytest.raises(wire.Malformed, match="global"):
        wire.loads_untrusted(pickle.dumps(Exploit()))
    assert wire.loads_untrusted(pickle.dumps(("ok", [1, 2.5, "x"], {"k": b"v"}))) == ("ok", [1, 2.5, "x"], {"k": b"v"})


@pytest.mark.parametrize("tree, why", [
    (("T", "float32", [2, 2], b"\0" * 15, "cpu"), "needs 16 bytes"),  # one byte short
    (("T", "object", [1], b"\0" * 8, "cpu"), "malformed"),  # a dtype that is not one
    (("A", "float32", [1], [1], 0, 1, "cpu"), "unknown tag"),  # an arena view: the judge's side only writes those
    (("P", pickle.dumps(1)), "unknown tag"),  # a pickled object: judge to implementation only
    (("L", [1, ("t", ())]), "list of atoms"),
    (["l", []], "untagged"),
])
def test_the_judge_refuses_malformed_trees(tree, why):
    decoder = wire.Decoder(lambda spec: None, trusted=False)
    with pytest.raises(wire.Malformed, match=why):
        decoder.decode(tree)


@pytest.mark.parametrize("rows, plain", [
    ([(0, 1, 2, 3), (4, 5, 6, 7)], True),
    ([], True),
    ([[0, 1, 2, 3]], False),  # a list row: not what the call server records
    ([(0, 1), (2, (3,))], False),  # a nested tuple
    ([(0, 1), (2, {"a": 1})], False),  # a dict, not an atom
])
def test_recorded_storage_calls_are_rows_of_atoms_or_refused(rows, plain):
    """A sink's calls come back as runs of argument tuples (`Server.ask`); the judge replays a run only when every
    row is a tuple of plain atoms (anything else: a malformed reply)."""
    assert wire.rows_of_atoms(wire.loads_untrusted(pickle.dumps(rows))) is plain


def test_tensors_come_back_as_plain_dense_copies():
    class Sub(torch.Tensor):
        pass

    t = torch.arange(12.0).reshape(3, 4).t().as_subclass(Sub)  # a strided subclass view
    tree = wire.Encoder(lambda obj: None).encode(t)
    back = wire.Decoder(lambda spec: None, trusted=False).decode(wire.loads_untrusted(wire.dumps(tree)))
    assert type(back) is torch.Tensor and back.is_contiguous() and torch.equal(back, t.as_subclass(torch.Tensor))


def test_an_input_mutated_through_the_arena_is_seen_by_the_judge():
    arena = wire.Arena(size=64)  # too small: the encoder asks for a larger one
    q = torch.randn(4, 8)[:, ::2]  # strided: the span it reads is copied, strides kept
    with pytest.raises(wire.ArenaFull) as full:
        wire.Encoder(lambda obj: None, arena).encode(q, "q")
    arena.grow(full.value.needed)
    encoder = wire.Encoder(lambda obj: None, arena)
    tree = encoder.encode(q, "q")
    seen = wire.Decoder(lambda spec: None, trusted=True, arena_map=lambda: arena.map).decode(tree)
    assert torch.equal(seen, q) and seen.stride() == q.stride() and wire.changed_inputs(encoder) == []
    seen[1, 1] += 1  # what the implementation's process would do to its view
    assert wire.changed_inputs(encoder) == ["q"]


PARITY_LAWS = {  # technique -> a correctness law and its bad-input law, each quick on every implementation
    "attention": ("scores_1000_999_998_10", "rejects_bad_input"),
    "attention_backward": ("fully_masked_rows_give_zero_gradients", "rejects_bad_input"),
    "block_manager": ("shared_prompt_copy_on_write", "rejects_bad_input"),
    "kvcache": ("every_prefill_starts_a_new_batch", "bad_input_is_rejected"),
    "paged_attention": ("rows_that_see_no_key_are_zero", "rejects_bad_input"),
    "quantization": ("worked_example_4bit", "rejects_bad_input"),
    "quantized_linear": ("all_zero_tokens_give_zeros", "rejects_bad_input"),
    "speculative": ("greedy_matches_target_greedy", "rejects_bad_input"),
}


@pytest.mark.parametrize("technique", sorted(PARITY_LAWS))
def test_honest_implementations_get_the_same_verdicts_both_ways(technique, monkeypatch):
    """Every registered implementation of a technique, judged from outside its process and inside the judge's
    (``--trusted-in-process``), through two of its laws: the boundary changes no honest verdict.  (The README's
    example plugins go through every law of their technique across the boundary in tests/test_docs.py, and
    HARNESS_SUITE_ISOLATED=1 runs the whole suite that way.)"""
    from llm_inference_harness.engine.registry import impls
    from llm_inference_harness.engine.runner import TRUSTED_IN_PROCESS, Target, check

    targets = [Target(technique, name=impl.name) for impl in impls(technique)]

    def statuses() -> dict[tuple[str, str], str]:
        results = check(technique, targets, profile="ci", properties=list(PARITY_LAWS[technique]))
        return {(r.name, v.property): v.status for r in results for v in r.verdicts}

    isolated = statuses()
    monkeypatch.setenv(TRUSTED_IN_PROCESS, "1")
    assert statuses() == isolated
    assert "pass" in isolated.values(), f"{technique}: nothing passed here: {isolated}"


BATCHED_MANAGERS = '''
import random

from llm_inference_harness.impls.block_manager.simple import SimpleBlockManager


class MovesTheRngInRefCount(SimpleBlockManager):
    def ref_count(self, block):
        random.random()
        return super().ref_count(block)


class KeepsALookupsTokens(SimpleBlockManager):
    kept = []

    def lookup_prefix(self, tokens):
        for earlier in self.kept:
            earlier.append(0)  # the lists earlier lookups were handed
        self.kept.append(tokens)
        return super().lookup_prefix(tokens)
'''


def test_a_batch_of_queries_is_judged_call_by_call(tmp_path):
    """`PluginProcess.call_many` sends runs of a query over single arguments as one list (counts, tables, lookups'
    tokens), and plain answers come back as values: what each call did is still its own answer -- a global
    state moved inside a run of ref_counts is every call's violation (as in-process), a lookup's list kept and
    changed at the next lookup is seen (in the same run of lookups: charged to the run's last), what a query raised
    is raised."""
    from llm_inference_harness.contracts.block_manager import NullStorage, open_manager
    from llm_inference_harness.engine.boundary import Reply
    from llm_inference_harness.engine.guard import ContractViolation
    from llm_inference_harness.engine.runner import Target, open_isolated

    plugin = tmp_path / "batched.py"
    plugin.write_text(BATCHED_MANAGERS)

    def manager(target):
        impl = open_isolated(target, one_thread=True)
        return open_manager(impl, 16, 4, NullStorage(), num_cpu_blocks=4, timed=False)

    m = manager(Target("block_manager", name="simple"))
    process, handle = m._m.process, m._m.handle
    m.allocate(1, [1, 2, 3, 4, 5])
    answers = process.call_many(handle, [("ref_count", (b,)) for b in range(4)] + [
        ("block_table", (1,)), ("lookup_prefix", ([1, 2, 3, 4, 5],)), ("num_free_blocks", ()), ("block_table", (7,))],
        10.0)
    assert answers[:7] == [1, 1, 0, 0, [0, 1], 4, 14], answers
    assert type(answers[7]) is Reply and answers[7].kind == "raised" and isinstance(answers[7].error, KeyError)
    assert m.block_table(1) == [0, 1] and m.num_free_blocks() == 14
    with pytest.raises(KeyError):
        m.block_table(7)
    process.close()

    m = manager(Target("block_manager", plugin=f"{plugin}:MovesTheRngInRefCount"))
    with pytest.raises(ContractViolation, match="changed global state: python random RNG"):
        [m.ref_count(b) for b in range(16)]
    m._m.process.close()

    m = manager(Target("block_manager", plugin=f"{plugin}:KeepsALookupsTokens"))
    m.lookup_prefix([1, 2, 3, 4])
    with pytest.raises(ContractViolation, match=r"the list \[1, 2, 3, 4\] handed to lookup_prefix became"):
        m.lookup_prefix([5, 6, 7, 8])
    m._m.process.close()

    m = manager(Target("block_manager", plugin=f"{plugin}:KeepsALookupsTokens"))  # kept and changed in one run
    first, second = m._m.process.call_many(m._m.handle, [("lookup_prefix", ([1, 2, 3, 4],)),
                                                          ("lookup_prefix", ([5, 6, 7, 8],))], 10.0)
    assert (first.kind, first.value, second.kind) == ("ok", 0, "violation"), (first, second)
    assert "the list [1, 2, 3, 4] handed to lookup_prefix became [1, 2, 3, 4, 0]" in second.payload
    m._m.process.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to colocate on")
def test_batches_run_the_judge_and_the_implementation_on_one_cpu_until_released():
    """A state machine's batches keep the judge and the implementation's process on one CPU (they take turns);
    `release_cpus` (a tensor call, the end of a property) gives both every CPU back, and so does closing it."""
    from llm_inference_harness.contracts.block_manager import NullStorage, open_manager
    from llm_inference_harness.engine.boundary import release_cpus
    from llm_inference_harness.engine.runner import Target, open_isolated

    release_cpus()  # a manager an earlier test left open
    cpus = os.sched_getaffinity(0)
    impl = open_isolated(Target("block_manager", name="simple"), one_thread=True)
    m = open_manager(impl, 16, 4, NullStorage(), num_cpu_blocks=4, timed=False)
    process = m._m.process
    try:
        m.allocate(1, [1, 2, 3])
        assert len(os.sched_getaffinity(0)) == 1 and os.sched_getaffinity(process.pid) == os.sched_getaffinity(0)
        release_cpus()
        assert os.sched_getaffinity(0) == cpus and os.sched_getaffinity(process.pid) == cpus
        m.append(1, 4)  # the next batch colocates them again
        assert len(os.sched_getaffinity(process.pid)) == 1 and m.block_table(1) == [0]
    finally:
        process.close()  # gives the CPUs back too
    assert os.sched_getaffinity(0) == cpus


def test_deferred_changes_travel_together():
    """`deferred`: the changes that return nothing go in one message, sent when the next query (or the block's end)
    needs them answered, and what one of them raised is raised then; in-process, the same answers."""
    from llm_inference_harness.contracts.block_manager import deferred

    with _simple_both_ways() as (isolated, here, posted):
        for m in (isolated, here):
            m.allocate(1, [1, 2, 3])
            sent = posted()
            with deferred(m):
                for token in range(10):
                    m.append(1, token)
                assert posted() == sent  # none sent yet
                assert m.num_tokens(1) == 13
            assert posted() == sent + 2 * (m is isolated)  # the ten appends in one message, then the query's
            assert len(m.block_table(1)) == 4
            with pytest.raises(KeyError), deferred(m):
                m.append(7, 1)  # no sequence 7


def test_queries_asked_ahead_are_answered_in_the_state_before_the_change():
    """`ahead`: queries a step reads only after its change has returned travel in front of the change, in its
    message, and answer as the state before it did; one that raised raises when read.  In-process, the same."""
    from llm_inference_harness.contracts.block_manager import ahead

    with _simple_both_ways() as (isolated, here, posted):
        for m in (isolated, here):
            m.allocate(1, [1, 2, 3, 4, 5])
            asked = ahead(m, [("lookup_prefix", ([1, 2, 3, 4, 9],)), ("num_free_blocks", ())])
            unknown = ahead(m, [("block_table", (2,))])
            sent = posted()
            assert m.allocate(2, [1, 2, 3, 4, 9]) == 4
            assert posted() == sent + (m is isolated)  # the allocate carried the queries: no message of their own
            assert asked.values() == [4, 14], asked.values()
            with pytest.raises(KeyError):
                unknown.values()
            assert m.num_free_blocks() == 13 and m.lookup_prefix([1, 2, 3, 4, 9]) == 4


def test_a_query_asked_ahead_once_joins_no_snapshot_after():
    """A query asked `ahead` joins the snapshots of the changes after it, as one asked of a state does, unless asked
    `once` (a machine's checks read a step late ask what they will not ask again).  In-process, the same answers."""
    from llm_inference_harness.contracts.block_manager import ahead

    with _simple_both_ways() as (isolated, here, posted):
        for m in (isolated, here):
            m.allocate(1, [1, 2, 3, 4, 5])
            m.allocate(2, [6, 7, 8])
            kept, once = ahead(m, [("num_tokens", (1,))]), ahead(m, [("num_tokens", (2,))], once=True)
            m.append(1, 6)
            assert kept.values() == [5] and once.values() == [3]
            m.append(2, 9)
            sent = posted()
            assert m.num_tokens(1) == 6
            assert posted() == sent  # in the append's reply
            assert m.num_tokens(2) == 4
            assert posted() == sent + (m is isolated)  # a message of its own


def test_a_sequence_a_change_did_not_make_drops_out_of_the_snapshots_alone():
    """The tables of the sequences changes named ride with the next changes' replies; one whose allocate raised
    (its table raises: unknown) drops out, the others stay, though their answers came in one group with its (a
    snapshot's queries travel grouped by method).  In-process, the same answers."""
    from llm_inference_harness.contracts.block_manager import OutOfBlocks

    with _simple_both_ways() as (isolated, here, posted):
        for m in (isolated, here):
            m.allocate(1, list(range(20)))
            m.allocate(2, list(range(100, 120)))
            with pytest.raises(OutOfBlocks):
                m.allocate(3, list(range(200, 240)))  # 10 blocks, 6 free
            m.append(1, 7)
            sent = posted()
            assert (len(m.block_table(1)), len(m.block_table(2))) == (6, 5)
            assert posted() == sent  # in the append's reply
            with pytest.raises(KeyError):
                m.block_table(3)


@contextlib.contextmanager
def _simple_both_ways():
    """simple's manager (16 blocks of 4, 4 CPU blocks, untimed) in its own process and in this one, and the count of
    the messages sent to the first (`PluginProcess.requests`)."""
    from llm_inference_harness.contracts.block_manager import NullStorage, open_manager
    from llm_inference_harness.engine.registry import get
    from llm_inference_harness.engine.runner import Target, open_isolated

    impl = open_isolated(Target("block_manager", name="simple"), one_thread=True)
    isolated = open_manager(impl, 16, 4, NullStorage(), num_cpu_blocks=4, timed=False)
    here = open_manager(get("block_manager", "simple"), 16, 4, NullStorage(), num_cpu_blocks=4, timed=False)
    process = isolated._m.process
    try:
        yield isolated, here, lambda: process.requests
    finally:
        process.close()
