"""The block-manager state machine (contract: harness/contracts/block_manager.py).

It drives a manager with small pools -- allocate (prefix-cache lookups included), append, fork, free, look up,
preempt by recompute and resume, swap out and in (several sequences at once, back in another order), and calls the
contract rejects -- against a shadow model that knows only each live sequence's tokens (`BlockManagerSteps`), and
checks the laws of `BlockManagerChecks` after every step.  Requests the rules admit go to the ``requests`` bundle,
which ``finish`` consumes; sequences the ``swap_out`` and ``preempt_by_recompute`` rules preempt go to bundles their
resuming rules consume.  A handle may be stale by then -- the scheduler finished, resumed or swapped it in meanwhile
-- and the call it makes is then one the contract rejects (a client holding an old id).

Programs reach the situations where bookkeeping bugs live (SITUATIONS) under memory pressure, whichever rules
Hypothesis's swarm testing leaves enabled: the initialize rule allocates two or three prompts (a later one may share
two or more blocks with one before and diverge), sends the shortest that fit on the CPU through swap round trips
(several out, a prompt admitted while they are out, back in swap order, the longest that fits out), and runs up to 16
iterations of a vLLM-style scheduler (the ``schedule`` rule: swapped-out sequences back first, oldest first, then
recomputed ones, a new prompt, a fork of a sequence with a partial last block, a decode step that preempts the newest
sequence by swap or recompute); the fork, swap-in and evicted-prefix rules free the oldest requests to make the room
they need; ``allocate_other_history`` builds two histories that meet (the same blocks at the same depth after
different earlier tokens) and a prompt of the first that goes on as the second did.  A single run's fractions hang on
one program, the richest, which its target phase varies for most of the run; tests/test_block_manager_reach.py checks
the floors of SITUATIONS on the programs of seeds 0-3 pooled.  Fractions of the ci profile's programs reaching each
situation (simple; vllm_style), mean over seeds 0-23 [the lowest single run]: OutOfBlocks on allocate 99; 98 [94; 94],
on append 95; 95 [77; 77], on swap_out 78; 78 [42; 59], on swap_in 73; 73 [45; 45], on swap_in with blocks free 64;
63 [0; 0]; copy-on-write 73; 72 [16; 14]; resumed by recompute 87; 89 [47; 71]; two cached blocks then diverging 79;
75 [60; 58], a cached block evicted 83; 81 [65; 61], a cached prefix reused after an eviction 73; 73 [22; 50], an
evicted prefix computed again 67; 71 [17; 50], the next block and the one before it cached under another history 34;
40 [0; 0]; multi-block swap 72; 71 [6; 6], several swapped at once 74; 74 [13; 13], back in out of order 73; 70 [13;
13], CPU blocks reused 82; 73 [58; 48], a CPU table out of block-id order 54; 62 [3; 0], parent writes first after
swap_in and fork 55; 55 [6; 3]; a rejected call while sequences are live 97; 95 [77; 77].
"""

from hypothesis import strategies as st
from hypothesis import target
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from llm_inference_harness.contracts.block_manager import guarded_batch
from llm_inference_harness.properties.block_manager_checks import BlockManagerChecks
from llm_inference_harness.properties.block_manager_steps import BlockManagerSteps, step
from llm_inference_harness.strategies.block_manager import (
    TOKEN_ALPHABET,
    appended_tokens,
    pool_geometries,
    prompts,
    token_lists,
)


class BlockManagerMachine(BlockManagerSteps, BlockManagerChecks, RuleBasedStateMachine):
    """Configured per run by `machine_for` (the implementation, the laws checked, where situations are collected)."""

    reached: list[frozenset[str]] | None = None  # each program's situations, appended at teardown

    requests = Bundle("requests")  # sequence ids the rules admitted
    swapped_out = Bundle("swapped_out")  # swapped out by the swap_out rule
    preempted_requests = Bundle("preempted_requests")  # preempted by the preempt_by_recompute rule

    @initialize(target=requests, geometry=pool_geometries(), data=st.data())
    @step
    def build(self, geometry, data):
        """A pool and two or three prompts sharing prefixes, swapped round while short, then a scheduler's iterations:
        the pool under pressure before the first rule, whichever rules are enabled."""
        self.open(geometry)
        admitted = []
        for i in range(data.draw(st.integers(2, 3), label="first prompts")):
            diverge = i > 0 and data.draw(st.booleans(), label="diverging prompt")  # a system prompt shared
            admitted += self.admit(self.diverging(data) if diverge else self.prompt(data))
        if len(fit := self.fit_on_cpu()) >= 2:
            self.do_swap_round_trips(data, fit)  # while the prompts are short enough to swap several at once
        for _ in range(data.draw(st.sampled_from([8, 12, 4, 16, 0]), label="scheduler iterations")):
            admitted += self.do_schedule(data)
        if self.shadow:
            self.do_rejected(data)
        return multiple(*admitted)

    def admit(self, tokens) -> list[int]:
        """Allocate a new request: its id, or none when it ran out of blocks."""
        return [self.next_id] if self.do_allocate(tokens) else []

    def prompt(self, data) -> list[int]:
        return data.draw(prompts(self.sources(), self.B), label="tokens")

    def tokens(self, data, sid, label, min_size):
        return data.draw(appended_tokens(self.shadow[sid], self.sources(), self.B, min_size), label=label)

    # ---- admitting requests
    @rule(target=requests, data=st.data())
    @step
    def allocate(self, data):
        return multiple(*self.admit(self.prompt(data)))

    @rule(target=requests, data=st.data())
    @step
    def allocate_diverging(self, data):
        return multiple(*self.admit(self.diverging(data)))

    def diverging(self, data) -> list[int]:
        """A prompt sharing two or more full blocks with an earlier one, then diverging (a system prompt and
        few-shot examples, then another question): chained hashes must tell the tails apart.  With no source
        of two full blocks yet, a fresh prompt of two blocks and a token makes one."""
        B, long = self.B, self.long_sources()
        if not long:
            return data.draw(token_lists(B, 2 * B + 1, 2 * B + 1), label="tokens")
        base = data.draw(st.sampled_from(long), label="base")
        cut = B * data.draw(st.integers(2, len(base) // B), label="shared blocks")
        tail = data.draw(token_lists(B, min_size=1), label="tail")
        if cut < len(base) and tail[0] == base[cut]:
            tail[0] = (tail[0] + 1) % TOKEN_ALPHABET
        return base[:cut] + tail

    def long_sources(self) -> list[list[int]]:
        return [p for p in self.sources() if len(p) >= 2 * self.B]

    @precondition(lambda self: self.long_sources())
    @rule(target=requests, data=st.data())
    @step
    def allocate_other_history(self, data):
        """Two histories that meet: a request holding blocks 0..d of an earlier prompt, a request that changes a
        token before block d, keeps blocks 1..d at their depth and goes on with a tail of its own, then a request of
        the first history that goes on with that tail.  Its block d + 1 and the block before it equal the second's,
        its earlier tokens do not: only a key covering the whole prefix keeps it from the second's cached block."""
        B = self.B
        base = data.draw(st.sampled_from(self.long_sources()), label="base")
        d = data.draw(st.integers(1, len(base) // B - 1), label="depth of the shared block")
        shared, changed = base[:(d + 1) * B], data.draw(st.integers(0, d * B - 1), label="token changed")
        tail = data.draw(token_lists(B, B, 2 * B + 1), label="tail")
        other = [*shared[:changed], (shared[changed] + 1) % TOKEN_ALPHABET, *shared[changed + 1:], *tail]
        self.make_room(min(self.g.num_blocks, 2 * (d + 1) + 2 * -(-len(tail) // B)))
        return multiple(*self.admit(shared), *self.admit(other), *self.admit(shared + tail))

    @precondition(lambda self: self.evicted)
    @rule(target=requests, data=st.data())
    @step
    def allocate_evicted(self, data):
        """A prompt through a prefix seen evicted (a request returning to a conversation whose KV was dropped),
        room made for it: its leading blocks still cached are hits, the evicted block is computed again (a hash
        left behind would serve the block's new contents)."""
        node = data.draw(st.sampled_from(sorted(self.evicted)), label="evicted prefix")
        tokens = self.prefixes.tokens(node) + data.draw(token_lists(self.B, 0, self.B), label="tail")
        self.make_room(-(-len(tokens) // self.B))
        return multiple(*self.admit(tokens))

    @rule(sid=consumes(requests))
    @step
    def finish(self, sid):
        """A request ends; one the scheduler has finished or preempted meanwhile is unknown to the manager."""
        if sid in self.shadow:
            self.do_free(sid)
        else:
            self.do_reject("free of a finished or preempted request", "free", ("seq_id",), sid)

    # ---- decoding and forking
    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    @step
    def append(self, data):
        sid = data.draw(st.sampled_from(self.resident()), label="append to")
        self.do_append(sid, self.tokens(data, sid, "tokens", 1))

    @precondition(lambda self: self.resident())
    @rule(target=requests, data=st.data())
    @step
    def fork(self, data):
        """Fork, then append to the child and to the parent: the first token of each copies a shared partial
        last block (the parent's after the child's, when its count is down to one, writes in place)."""
        return self.fork_drawn(data, data.draw(st.sampled_from(self.resident()), label="fork"))

    @precondition(lambda self: self.partial(self.resident()))
    @rule(target=requests, data=st.data())
    @step
    def fork_and_write(self, data):
        """The fork rule on a sequence whose last block is partial, with a block made free for the copy: the
        first writer copies the shared block (copy-on-write), the second writes in place."""
        parent = data.draw(st.sampled_from(self.partial(self.resident())), label="fork")
        self.make_room(2, keep={parent})
        return self.fork_drawn(data, parent)

    def fork_drawn(self, data, parent):
        then = self.tokens(data, parent, "child appends", 0)
        parent_then = data.draw(token_lists(self.B, max_size=self.B), label="parent appends")
        return self.do_fork(parent, then, parent_then, data.draw(st.booleans(), label="parent first"))

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    @step
    def lookup_prefix(self, data):
        self.do_lookup(self.prompt(data))

    # ---- preemption
    @precondition(lambda self: self.resident())
    @rule(target=preempted_requests, data=st.data())
    @step
    def preempt_by_recompute(self, data):
        sid = data.draw(st.sampled_from(self.resident()), label="preempt")
        self.do_preempt(sid)
        return sid

    @rule(sid=consumes(preempted_requests))
    @step
    def resume_preempted(self, sid):
        """Recompute a preempted request; the scheduler may have resumed it already (its id is live: allocating
        it again is rejected) or resumed and finished it (nothing to do)."""
        if sid in self.preempted:
            self.do_resume(sid)
        elif sid in self.shadow:
            self.do_reject("allocate of a resumed request under its live seq_id", "allocate", ("seq_id",), sid,
                           self.hand(self.shadow[sid]))

    @precondition(lambda self: self.resident())
    @rule(target=swapped_out, data=st.data())
    @step
    def swap_out(self, data):
        sid = data.draw(st.sampled_from(self.resident()), label="swap out")
        self.do_swap_out(sid)
        return sid

    @rule(sid=consumes(swapped_out))
    @step
    def swap_in(self, sid):
        """Swap a request back in; the scheduler may have swapped it in or finished it meanwhile (rejected)."""
        if sid in self.swapped:
            self.do_swap_in(sid)
        else:
            self.do_reject("swap_in of a request no longer swapped out", "swap_in", ("seq_id",), sid)

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
                self.do_allocate(self.prompt(data))  # a swap_in then runs out
            for sid in [s for s in batch if s in self.swapped]:
                self.do_swap_in(sid)
        room = self.m.num_free_cpu_blocks()
        fits = [s for s in self.resident() if len(self.m.block_table(s)) <= room]
        if fits:  # the longest that fits in the CPU blocks left
            self.do_swap_out(max(fits, key=lambda s: len(self.m.block_table(s))))

    @precondition(lambda self: self.swapped)
    @rule(target=requests, data=st.data())
    @step
    def swap_in_and_fork(self, data):
        """A swapped-out request resumes and samples again (parallel sampling, beam search): swap_in, fork, the
        parent then the child write the shared last block -- its count is 2 again, on a block swap_in just made."""
        sid = data.draw(st.sampled_from(self.partial(self.swapped) or self.swapped), label="swap in")
        self.make_room(len(self.shadow[sid]) // self.B + 2)  # its blocks and the copy of its last one
        self.do_swap_in(sid)
        if sid in self.swapped:
            return multiple()
        return self.do_fork(sid, self.tokens(data, sid, "child appends", 0),
                            data.draw(token_lists(self.B, 1, max_size=self.B), label="parent appends"),
                            parent_first=True)  # the child first: the fork rule

    # ---- the scheduler
    @rule(target=requests, data=st.data())
    @step
    def schedule(self, data):
        return multiple(*self.do_schedule(data))

    def do_schedule(self, data) -> list[int]:
        """One iteration of a vLLM-style scheduler (Kwon et al. 2023, Sec. 4.5): swapped-out sequences come back
        first, oldest first (so out of swap order), until one finds too few blocks; preempted ones are recomputed;
        a new prompt is admitted; one running sequence may fork (parallel sampling) and write first; every running
        sequence decodes a token, and one that finds no block preempts the newest running sequence, by swap or
        by recompute.  Nearly every situation comes up under this memory pressure.  The requests it admitted."""
        back = []
        for sid in list(self.swapped):
            self.do_swap_in(sid)
            if sid in self.swapped:
                break
            back.append(sid)
        for sid in sorted(self.preempted):
            self.do_resume(sid)
        diverge = data.draw(st.booleans(), label="diverging prompt")
        admitted = self.admit(self.diverging(data) if diverge else self.prompt(data))
        running, token = self.resident(), st.integers(0, TOKEN_ALPHABET - 1)
        forked = ()
        if running and data.draw(st.booleans(), label="fork"):
            parents = self.partial(back) or self.partial(running) or running  # a partial last block: copy-on-write
            forked = (data.draw(st.sampled_from(parents), label="parent"),)
            self.make_room(1, keep=forked)  # a finished request frees the block its copy-on-write takes
            running = self.resident()
            admitted.append(self.do_fork(forked[0], (), [data.draw(token, label="parent token")], parent_first=True))
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
        return admitted

    # ---- calls the contract rejects
    @rule(data=st.data())
    @step
    def rejected_call(self, data):
        self.do_rejected(data)

    @precondition(lambda self: self.shadow)
    @rule(data=st.data())
    @step
    def rejected_call_while_live(self, data):
        """The same, once sequences are live (a second rule: Hypothesis weighs rules equally), where a rejected
        call has tables, counts and cached blocks to disturb."""
        self.do_rejected(data)

    def do_rejected(self, data):
        what, method, names, args = data.draw(st.sampled_from(self.bad_calls()), label="rejected call")
        self.do_reject(what, method, names, *args(data))

    # ---- invariants
    @invariant()
    @step
    def bookkeeping(self):
        if "bookkeeping" in self.checks and hasattr(self, "m"):
            self.check_bookkeeping()

    @invariant()
    @step
    def data_reads_back(self):
        if not hasattr(self, "m"):
            return
        self.note_evictions()
        if "data" in self.checks:
            self.check_data()

    def teardown(self):
        if hasattr(self, "seen") and currently_in_test_context():
            target(float(len(self.seen)), label="situations reached")  # steers generation toward rich programs
            if self.reached is not None:
                self.reached.append(frozenset(self.seen))
        if "bookkeeping" in self.checks and hasattr(self, "m") and not self.failed:
            guarded_batch(self.impl, self.pool_whole_at_end)


def machine_for(impl, checks: frozenset[str], reached: list[frozenset[str]] | None = None) -> type:
    """The state machine for ``impl`` checking ``checks``; each program's situations are appended to ``reached``.
    A derandomized profile seeds a machine from its class's source, or its name where it has none: named for the
    implementation, a run draws the same programs after an edit of the rules' text that leaves their draws alone."""
    return type(f"BlockManagerMachine[{impl.name}]", (BlockManagerMachine,),
                {"impl": impl, "checks": checks, "reached": reached})
