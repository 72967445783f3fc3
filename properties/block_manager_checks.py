"""What the block-manager state machine checks after every step and at its end, and the calls it expects rejected
(contract: harness/contracts/block_manager.py).

Two sets of laws, so that each mutant is killed for the reason it declares: ``bookkeeping`` (pool conservation,
reference counts = block-table entries, each live sequence's swap flag and length -- read a step late, with the next
step's first message --, block tables and token lists the caller owns, the accepted calls replayed on a fresh
manager making the same storage calls, a whole pool after freeing everything) and ``data`` (what each sequence reads
through its block table is the KV of its own prefix, no write into a block whose count exceeds one).
"""

from hypothesis import strategies as st

from llm_inference_harness.contracts.block_manager import ahead, open_manager, prefetch, run_calls
from llm_inference_harness.strategies.block_manager import prompts
from llm_inference_harness.strategies.block_manager_shadow import RecordingStorage

NOT_INTS = (1.5, "0", None)  # tokens the contract rejects: each would hash into the cache as another block


class BlockManagerChecks:
    """Mixed into the machine next to `BlockManagerSteps`, whose state it reads."""

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

    def check_bookkeeping(self) -> None:
        for kept, handed in self.given:
            assert tuple(kept) == handed, (f"the token list {list(handed)} handed to allocate/lookup_prefix "
                                           f"became {kept}: the manager kept the caller's list and changed it")
        n = self.g.num_blocks
        self.check_flags_and_lengths()
        prefetch(self.m, [("block_table", (sid,)) for sid in self.shadow] + [("ref_count", (b,)) for b in
                 range(n)] + [("num_free_blocks", ()), ("num_free_cpu_blocks", ())])  # one message, in its process
        self.ask_flags_and_lengths()  # after the prefetch, which would otherwise send them in a message of its own
        entries = [0] * n
        tables = {sid: self.table(sid) for sid in self.shadow}
        for sid, tokens in self.shadow.items():
            table = tables[sid]
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

    def ask_flags_and_lengths(self) -> None:
        """is_swapped and num_tokens of every live sequence, asked of the state after this step `ahead` and checked
        by the next step's invariant (or the teardown): a manager in the implementation's process answers them with
        the next message, not in every change's snapshot in case the step ends there (~70% of which never did)."""
        live = [(sid, sid in self.swapped, len(tokens)) for sid, tokens in self.shadow.items()]
        self.unread_flags = (live, ahead(self.m, [(q, (sid,)) for sid, *_ in live for q in ("is_swapped",
                                                                                          "num_tokens")], once=True))

    def check_flags_and_lengths(self) -> None:
        """The answers `ask_flags_and_lengths` asked after the previous step."""
        live, asked = self.unread_flags
        answers = iter(asked.values() if live else ())
        for sid, swapped, length in live:
            flag, got = next(answers), next(answers)
            assert flag == swapped, (f"sequence {sid}: is_swapped answered {flag} after a step that left it "
                                     f"{'swapped out' if swapped else 'resident'}")
            assert got == length, f"sequence {sid}: num_tokens answered {got} after a step that left it with {length}"
        self.unread_flags = ([], None)

    def check_data(self) -> None:
        assert not self.storage.violations, self.storage.violations[0]
        prefetch(self.m, [("block_table", (sid,)) for sid in self.shadow])
        for sid, tokens in self.shadow.items():
            pool = self.storage.cpu if sid in self.swapped else self.storage.gpu
            table, want = self.m.block_table(sid), self.kv_ids(sid)
            for i in range(len(tokens)):
                got = pool[table[i // self.B]][i % self.B]
                assert got == want[i], (f"sequence {sid} reads token {i} through block {table[i // self.B]} "
                                        f"as the KV of {self.prefixes.shown(got)}, expected "
                                        f"{self.prefixes.shown(want[i])}")

    def note_evictions(self) -> None:
        """Full blocks overwritten since the last step whose prefix is no longer found: evicted (for events and the
        evicted-prefix rule).  Their lookups are asked of this state `ahead` and read at the next step's call: a
        manager in the implementation's process answers them with that step's first message, not one of their own
        (252 of the 1,011 messages of a ci run's simple machine_bookkeeping that asked queries only).  Read one step
        late in-process too, so that both judges draw the same programs."""
        nodes, lookups = self.unread_evictions
        for node, found in zip(nodes, lookups.values() if nodes else (), strict=True):
            if found < len(self.prefixes.tokens(node)):
                self.evicted.add(node)
                self.situation("prefix: a cached block evicted")
        candidates = sorted(self.storage.overwritten - self.evicted)
        self.unread_evictions = (candidates, ahead(self.m, [("lookup_prefix", (self.prefixes.tokens(node),))
                                                             for node in candidates]))
        self.storage.overwritten.clear()

    def replay(self) -> None:
        """The accepted calls on a fresh manager, none of the calls that raised: the same results and storage
        calls, or a call that raised (or a query) changed hidden state (the contract's determinism).  All at once
        (`run_calls`: one message to a manager in the implementation's process), then, if they differ, one by one
        on another fresh manager to name the first call that does."""
        calls = [(method, tuple(list(a) if isinstance(a, list) else a for a in args))
                 for method, args, _, _ in self.accepted]
        twin, storage = self.fresh_twin()
        got = [value for _, value in run_calls(twin, calls)]
        if got == [out for _, _, out, _ in self.accepted] and storage.trace == [
                c for *_, made in self.accepted for c in made]:
            return
        twin, storage = self.fresh_twin()
        for k, ((method, args), (_, _, out, made)) in enumerate(zip(calls, self.accepted, strict=True)):
            start = len(storage.trace)
            ((_, got),) = run_calls(twin, [(method, args)])
            again = tuple(storage.trace[start:])
            assert (got, again) == (out, made), (
                f"the {k + 1}th accepted call {method}{args} returned {out!r} with storage calls {list(made)[:8]}; "
                f"on a fresh manager given only the accepted calls it returned {got!r} with {list(again)[:8]}: "
                f"a call that raised ({'; '.join(self.raised[-4:])}) or a query changed the manager")
        raise AssertionError("the accepted calls replayed on a fresh manager differ all at once, not one by one: "
                             "the manager is not deterministic (the same calls made other storage calls or returned "
                             "other values)")

    def fresh_twin(self) -> tuple:
        """A fresh manager for the replay, and its storage, which records every call."""
        storage = RecordingStorage()
        return open_manager(self.impl, self.g.num_blocks, self.B, storage, num_cpu_blocks=self.g.num_cpu_blocks,
                            timed=False), storage

    def pool_whole_at_end(self) -> None:
        self.check_flags_and_lengths()
        if self.raised:
            self.replay()
        freed = zip(self.shadow, run_calls(self.m, [("free", (sid,)) for sid in self.shadow]), strict=True)
        raised = [(sid, what) for sid, (returned, what) in freed if not returned]
        assert not raised, f"free({raised[0][0]}) of a live sequence at the end raised {raised[0][1]}"
        n = self.g.num_blocks
        assert self.m.num_free_blocks() == n, f"after freeing everything {self.m.num_free_blocks()} of {n} free"
        assert all(self.m.ref_count(b) == 0 for b in range(n)), "after freeing everything a count is not 0"
        assert self.m.num_free_cpu_blocks() == self.g.num_cpu_blocks, "after freeing everything CPU blocks leak"

    def bad_calls(self) -> list[tuple]:
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
