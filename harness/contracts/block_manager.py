"""The block-manager contract: PagedAttention's memory manager (Kwon et al. 2023, "vLLM", Sec. 4.2-4.5).

A registered implementation is a factory (usually the class itself):

    make(num_blocks: int, block_size: int, storage: KVStorage, *, num_cpu_blocks: int = 0) -> manager

The manager keeps, for every sequence, a block table mapping logical block i (tokens
i*block_size .. (i+1)*block_size - 1) to a physical block of a GPU pool of ``num_blocks`` blocks:

    allocate(seq_id, tokens) -> int   new sequence holding ``tokens``; its leading full blocks are taken
                                       from the prefix cache where present; returns how many leading
                                       tokens were served from the cache (a multiple of block_size)
    append(seq_id, token)             one more token; a block is allocated when the token crosses a block
                                       boundary; a shared last block is copied before the write (copy-on-write),
                                       which takes a block too
    fork(parent_id, child_id)         the child shares every block of the parent (reference counts go up)
    free(seq_id)                      reference counts go down; blocks at zero return to the free pool
                                       (preemption by recompute = free, then allocate again later)
    lookup_prefix(tokens) -> int      how many leading tokens a new sequence with these tokens would find
                                       cached now (a multiple of block_size); changes nothing
    swap_out(seq_id) / swap_in(seq_id)  preemption by swap: move the blocks to the CPU pool and back
    block_table(seq_id) -> list[int]  physical blocks (in the CPU pool while swapped out), in a new list the
                                       caller owns: changing it changes nothing in the manager
    is_swapped(seq_id) -> bool; num_tokens(seq_id) -> int
    ref_count(block) -> int           number of block-table entries of GPU-resident sequences pointing at it
    num_free_blocks() -> int; num_free_cpu_blocks() -> int

Prefix caching: a *full* block is identified by a key that covers its whole prefix -- every token before it and
its own --, such as a hash of its tokens chained with the key of the block before it, so that equal keys mean equal
whole prefixes.  A key over the previous block's tokens (or any window) is not enough: two histories that agree on a
block and the one before it but differ earlier would share a cached block whose KV was computed under the other's
prefix.  A block enters the cache when it fills: a prompt's full blocks at allocate, a block filled by appends at
the append that fills it (decoded tokens are reused as prompt tokens are: a chat's next turn sends the answer back),
unless a block of the same key is cached already.  The cache holds no reference: a cached
block whose count drops to zero is free (it counts in num_free_blocks) but keeps its contents
until it is evicted, least recently used first, to make room: the cached block whose count dropped to
zero longest ago goes first (among blocks released by one call the order is open), a cache hit takes
a block out of that order until its count drops to zero again, and lookup_prefix does not touch it.

Data moves only through the ``storage`` the caller passes (the caller plays the model):
``storage.write(block, offset, seq_id, position)`` computes the KV of token ``position`` of sequence
``seq_id`` into a GPU slot, ``storage.copy(src, dst)`` copies a GPU block, ``storage.swap_out(gpu, cpu)``
and ``storage.swap_in(cpu, gpu)`` move a block between the pools.  The manager must write exactly
the tokens it did not take from the cache, and never into a block whose count exceeds one.

Running out of blocks (GPU pool on allocate/append/swap_in, CPU pool on swap_out) raises
`OutOfBlocks`; a call raises it only when it needs more blocks than are free (cache hits on blocks in use need
none, hits on idle cached blocks take theirs).  Bad arguments raise ValueError, TypeError or KeyError naming the
argument; append, fork and swap_out of a swapped-out sequence, and swap_in of a resident one, raise ValueError
naming seq_id (for fork parent_id, or seq_id).  A call that raises leaves the manager exactly as it was, hidden
state included, and makes no storage call: every query answers as before, and the calls that follow behave as
they would have without it.  A manager is deterministic: the same calls on a fresh manager make the same
storage calls and return the same values (a failing program replays; the serving simulator's runs repeat).

Pools hold at most MAX_BLOCKS blocks each (num_blocks, num_cpu_blocks); a larger one is rejected with a
ValueError naming the argument and the limit, unless the manager handles it lazily, in time and memory
independent of the pool size.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from llm_inference_harness.contracts import Rule, Technique, define
from llm_inference_harness.engine.boundary import Reply
from llm_inference_harness.engine.capabilities import Caps, cap
from llm_inference_harness.engine.guard import ContractViolation, call_limit, guarded_call, is_remote

if TYPE_CHECKING:  # the registry imports the contracts: they name its record for type checking only
    from llm_inference_harness.engine.registry import Impl


@dataclass(frozen=True)
class BlockManagerCaps(Caps):
    prefix_caching: bool = cap(True, "lookup_prefix returns cached blocks of earlier prompts (every manager must)")
    swap: bool = cap(True, "swap_out / swap_in move a sequence to CPU blocks and back (every manager must)")

BLOCK_MANAGER = define(
    Technique(
        name="block_manager",
        signature="make(num_blocks, block_size, storage, *, num_cpu_blocks=0) -> manager "
                  "(allocate, append, fork, free, lookup_prefix, swap_out, swap_in, block_table, ref_count, ...)",
        summary="paged KV-cache bookkeeping: block tables, ref counts, copy-on-write, prefix cache, swap",
        properties=("llm_inference_harness.properties.test_block_manager",),
        reference="",
        caps=BlockManagerCaps,
        rules=(
            Rule("bookkeeping", "blocks are conserved, reference counts equal block-table entries, running out of "
                                "blocks is declared, and a rejected call changes nothing",
                 ("machine_bookkeeping", "large_tables")),
            Rule("data", "every live sequence reads its own tokens' KV through its block table; a shared block is "
                         "copied before a write (copy-on-write)", ("machine_data", "large_tables")),
            Rule("sharing", "a sequence holds ceil(tokens / block_size) blocks, and forks and cached prefixes share "
                            "their full blocks (vLLM Sec. 4.3-4.4)",
                 ("parallel_sampling_saves_70_percent", "shared_prompt_copy_on_write", "next_turn_reuses_the_answer",
                  "waste_per_request_is_half_a_block")),
            Rule("eviction", "idle cached blocks are evicted least recently used first; swap_out releases a block as "
                             "free does", ("evicts_least_recently_used",)),
            Rule("bad input", "bad geometry, unknown or duplicate sequences and bad tokens raise ValueError naming "
                              "the argument", ("rejects_bad_input",)),
        ),
    )
)

MAX_BLOCKS = 2**20  # a 141 GB H200 holds ~70,000 blocks of 16 Llama-3-8B tokens (2 MiB each): 15x headroom

METHODS = ("allocate", "append", "fork", "free", "lookup_prefix", "swap_out", "swap_in", "block_table",
           "is_swapped", "num_tokens", "ref_count", "num_free_blocks", "num_free_cpu_blocks")


class OutOfBlocks(Exception):  # noqa: N818 - the contract's name for a declared outcome, not an error
    """The pool has too few free blocks for the request; the manager's state is unchanged."""


class KVStorage(Protocol):
    def write(self, block: int, offset: int, seq_id: int, position: int) -> None: ...
    def copy(self, src: int, dst: int) -> None: ...
    def swap_out(self, gpu_block: int, cpu_block: int) -> None: ...
    def swap_in(self, cpu_block: int, gpu_block: int) -> None: ...


class NullStorage:
    """Storage that keeps nothing: for bookkeeping-only runs (the serving simulator).  Its methods return
    nothing and read nothing back, so a manager in the implementation's process records its calls and the
    judge replays them when the manager's call returns (``harness_sink``: one message, not one per write)."""

    harness_sink = True

    def write(self, block, offset, seq_id, position):
        pass

    def copy(self, src, dst):
        pass

    def swap_out(self, gpu_block, cpu_block):
        pass

    def swap_in(self, cpu_block, gpu_block):
        pass


class CountingStorage(NullStorage):
    """Counts writes and records every copy-on-write (src, dst): what the worked examples report."""

    def __init__(self) -> None:
        self.writes, self.copies = 0, []

    def write(self, block, offset, seq_id, position):
        self.writes += 1

    def copy(self, src, dst):
        self.copies.append((src, dst))


def check_geometry(num_blocks: Any, block_size: Any, num_cpu_blocks: Any) -> None:
    """Validate the factory's arguments; raises ValueError naming the argument (and the limit of a pool)."""
    for name, value, low, high in (("num_blocks", num_blocks, 0, MAX_BLOCKS), ("block_size", block_size, 1, None),
                                   ("num_cpu_blocks", num_cpu_blocks, 0, MAX_BLOCKS)):
        if not is_int(value) or value < low:
            raise ValueError(f"block manager: {name} must be an int >= {low}, got {value!r}")
        if high is not None and value > high:
            raise ValueError(f"block manager: {name} must be at most MAX_BLOCKS = 2**20 = {high}, got {value!r}")


def check_tokens(tokens: Any) -> list[int]:
    if not isinstance(tokens, list | tuple) or not tokens or not all(map(is_int, tokens)):
        raise ValueError(f"block manager: tokens must be a non-empty list of ints, got {tokens!r}")
    return list(tokens)


def check_token(token: Any) -> int:
    if not is_int(token):  # a float or str token would hash into the prefix cache as a different block
        raise ValueError(f"block manager: token must be an int, got {token!r}")
    return token


def check_block(block: Any, num_blocks: int) -> int:
    if not is_int(block) or not 0 <= block < num_blocks:  # -1 would index the last block from the end
        raise ValueError(f"block manager: block must be an int in [0, {num_blocks}), got {block!r}")
    return block


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def open_manager(impl: Impl, num_blocks: int, block_size: int, storage: Any, *, num_cpu_blocks: int = 0,
                 timed: bool = True):
    """Build a manager from an implementation and check it offers every method of the contract.  ``timed``:
    each call guarded (per-call limit, global state left alone); a caller making many cheap calls passes False
    and guards its batches with `guarded_batch` (the serving simulator, which times the scheduler, does neither)."""
    try:
        # no CPU pool: the contract's default, left out, so that a factory whose default is not 0 is caught
        cpu = {"num_cpu_blocks": num_cpu_blocks} if num_cpu_blocks else {}
        manager = impl.fn(num_blocks, block_size, storage, **cpu)
    except Exception as exc:
        raise ContractViolation(f"{impl.name}: the factory raised {type(exc).__name__}: {exc}") from exc
    missing = [m for m in METHODS if not callable(getattr(manager, m, None))]
    if missing:
        raise ContractViolation(f"{impl.name}: the manager lacks the contract's method(s) {missing}")
    if is_remote(manager):
        manager = Observed(manager, num_blocks, call_limit(impl))
    return TimedManager(impl, manager) if timed else manager


QUERIES = ("block_table", "is_swapped", "num_tokens", "ref_count", "num_free_blocks", "num_free_cpu_blocks",
           "lookup_prefix")
SNAPSHOT_BLOCKS = 4096  # pools up to this size have every block's count in a step's snapshot
SEQ_QUERIES = ("block_table", "is_swapped", "num_tokens")
DEFERRABLE = ("append", "fork", "free", "swap_out", "swap_in")  # return nothing (the contract)
IN_FLIGHT = 32  # messages of deferred changes sent and not yet collected, at most (the channel's buffers stay far
                # from full)
QUEUED = 32  # deferred changes in one message, at most: they share one per-call limit over there, as a step's
             # change and its snapshot's queries do (a worked example's decode loop: ~1,000 appends)
WINDOW = 8  # a snapshot after a change holds the queries asked in the state before it and in this many before that
NAMED = 8  # a snapshot after a change holds the tables of this many sequences changes named latest (a machine's
           # scheduler decodes each running sequence in turn, its rules' invariants ask every live one's)
PREFETCHED = 4  # a snapshot after a change also holds the queries of this many latest prefetches (`Observed.prefetch`)
RECENT_LOOKUPS = 16  # a snapshot also looks up the token lists looked up most recently (a machine observes the
                     # cache through the lookups of its latest prompts before and after every step)


class Observed:
    """A manager in the implementation's process, its queries (which change nothing, says the contract) answered
    from one snapshot per state: a call that changes the state brings back, in its reply, every block's count, the
    free counts, each known sequence's table, swap flag and length, and the latest lookups again
    (`PluginProcess.call_many`); other queries are asked once per state.  A state machine asks ~10^5 queries per
    program: one message each would cost more than the manager's own work.  After the first change, a snapshot
    holds the queries the caller asked in the state before and the `WINDOW` states before it (a machine's rules
    ask different ones: a machine_bookkeeping program of the ci profile missed ~16,800 queries with one state,
    ~3,200 with eight), lookups only from the state before, the tables of the `NAMED` sequences changes named
    latest since a prefetch asked them (one the manager does not know is dropped), and what the caller said it
    expects (`expect`); a worked example that appends 3,000 tokens and asks nothing between them pays for no query
    of a 320-block pool.  A caller about to ask many queries of one state fetches those missing in one message
    (`prefetch`); calls whose replies it compares only afterwards go in one message (`run_calls`); queries it reads
    only once its next change has returned go in front of that change, in its message (`ahead`).  The answers are
    the state's after the change before the storage's recorded calls are replayed (a storage reads the counts)."""

    def __init__(self, manager: Any, num_blocks: int, limit_s: float) -> None:
        self._m, self._blocks, self._limit = manager, num_blocks, limit_s
        self._seqs: dict = {}  # seq ids the caller named, in order
        self._named: dict = {}  # the latest `NAMED` of those named by a change since a prefetch asked their tables
        self._lookups: dict = {}  # token lists the caller looked up, the latest last
        self._answers: dict | None = None
        self._asked: dict | None = None  # the queries asked in this state, {key: (name, args)}; None before a change
        self._window: collections.deque = collections.deque(maxlen=WINDOW)  # those of the states before it
        self._prefetched: collections.deque = collections.deque(maxlen=PREFETCHED)  # the latest `prefetch` calls'
        self._expected: dict = {}  # queries the caller will ask after the next change (`expect`)
        self._deferred = False  # inside `deferred`: changes that return nothing are sent without waiting
        self._queued: list = []  # deferred changes not sent yet: they travel together, when anything else is sent
        self._pending: collections.deque = collections.deque()  # the tickets of those sent, oldest first
        self._ahead: list = []  # (call, its `Ahead`, its index there): asked of this state, sent with the next message

    def __getattr__(self, name: str) -> Any:  # the queries are methods of the class (`_query_method`)
        method = getattr(self._m, name)
        if not callable(method):
            return method

        def changes(*args: Any, **kwargs: Any) -> Any:
            self._note_change(name, args)
            if self._deferred and name in DEFERRABLE and not kwargs and not self._ahead:
                self._next_state({})
                self._queued.append((name, args))
                if len(self._queued) >= QUEUED:
                    self._send_queued()
                return None
            queued = self._unsent()
            snapshot = dict(_by_method(self._snapshot().items()))
            ahead, self._ahead = _by_method(self._ahead), []
            front = [*queued, *(call for call, _, _ in ahead)]

            def settle(replies: list) -> None:  # before the storage's calls are replayed: it may ask the counts
                _resolve(ahead, replies[len(queued):])
                self._next_state(dict(zip(snapshot, replies[len(front) + 1:], strict=True)))

            self._answers = {}  # a failure to reply leaves no answer of the state before
            replies = self._m.process.call_many(self._m.handle, [*front, (name, args, kwargs), *snapshot.values()],
                                                self._limit, then=settle)
            _raise_first(replies[:len(queued)])
            return _value(replies[len(front)])

        return changes

    def run_calls(self, calls: list[tuple[str, tuple]]) -> list[tuple[bool, Any]]:
        """`run_calls` for a manager in the implementation's process: the calls in one message, no snapshot."""
        self._collect()
        self._send_ahead()
        for name, args in calls:
            self._note_change(name, args)
        self._answers = {}  # a failure to reply leaves no answer of the state before
        replies = self._m.process.call_many(self._m.handle, list(calls), self._limit)
        self._next_state(None)  # the next query brings the snapshot of the state after
        violation = next((r for r in replies if type(r) is Reply and r.kind not in ("ok", "raised")), None)
        if violation is not None:
            raise ContractViolation(violation.payload)
        return [(True, r) if type(r) is not Reply else (True, r.value) if r.kind == "ok" else (False, _raised(r.error))
                for r in replies]

    def prefetch(self, calls: list[tuple[str, tuple]]) -> None:
        """The answers of these queries in this state, those not known yet in one message.  They join the snapshots
        of the changes that follow until `PREFETCHED` later prefetches have replaced them, lookups excepted (as in
        `_next_state`): a machine's invariants prefetch what they check after every step, and a step may make more
        changes than `WINDOW` (an append of many tokens)."""
        wanted = _keyed(calls)
        self._prefetched.append({key: call for key, call in wanted.items() if key[0] != "lookup_prefix"})
        for seq in [s for s in self._named if ("block_table", (s,)) in wanted]:
            del self._named[seq]
        self._known(wanted)

    def _known(self, wanted: dict) -> None:
        """Every query of ``wanted`` ({key: (name, args)}) answered in this state: the deferred changes collected
        first, then those not known yet in one message, with the state's snapshot if it has none yet."""
        self._collect()
        if self._answers is None:
            self._answers = self._fetch({**self._snapshot(), **wanted})
            return
        missing = {key: call for key, call in wanted.items() if key not in self._answers}
        if missing or self._ahead:
            self._answers.update(self._fetch(missing))

    def _note_change(self, name: str, args: tuple) -> None:
        """The sequences a change names (their queries join the snapshots); a freed one's are dropped."""
        for a in _sequences(name, args):
            if is_int(a):
                self._seqs.setdefault(a)
                self._named.pop(a, None)
                self._named[a] = None
                if len(self._named) > NAMED:
                    del self._named[next(iter(self._named))]
        if name == "free" and args:
            self._forget(args[0])  # its queries will raise: asked one by one, if ever

    def expect(self, calls: list[tuple[str, tuple]]) -> None:
        """These queries come back with the next change's snapshot."""
        self._expected.update(_keyed(calls))

    def _next_state(self, answers: dict | None) -> None:
        """A change was made: the queries asked in the state before join the window, but its lookups (a lookup
        costs the manager a hash per block, and the same lookup is seldom asked two states apart: a ci run's machine
        programs brought back 48,590 lookups with them, 29,990 without), and ``answers`` are the new state's."""
        if self._asked is not None:
            self._window.append({k: call for k, call in self._asked.items() if k[0] != "lookup_prefix"})
        self._answers, self._asked = answers, {}
        if answers:  # a sequence whose table query raised (an allocate that raised) is not asked again; an answer
            # is a `Reply` "ok" too where another call of its group raised (`PluginProcess.call_many`)
            for seq in [s for s in self._named if _failed(answers.get(("block_table", (s,))))]:
                del self._named[seq]

    def _send_queued(self) -> None:
        """The deferred changes not sent yet, in one message, its reply collected later (`_collect`)."""
        self._pending.append(self._m.process.post_many(self._m.handle, self._queued, self._limit))
        self._queued = []
        if len(self._pending) > IN_FLIGHT:
            self._collect(1)

    def _unsent(self) -> list:
        """The deferred changes not sent yet, taken to travel in front of the next change (a worked example's free,
        then its next allocate: one message); those sent are collected first."""
        queued, self._queued = self._queued, []
        try:
            self._collect()
        except BaseException:
            self._queued = queued + self._queued  # sent at the block's end
            raise
        return queued

    def _collect(self, n: int | None = None) -> None:
        """The replies of the oldest ``n`` (default: all, those not sent yet sent first) messages of deferred
        changes, their storage calls replayed in order; the first change that did not return raises here, once
        every reply is in."""
        if n is None and self._queued:
            self._send_queued()
        replies = []
        for _ in range(len(self._pending) if n is None else min(n, len(self._pending))):
            replies += self._m.process.finish_many(self._pending.popleft())
        try:
            _raise_first(replies)
        except BaseException:
            self._collect()  # every change sent is made: the later ones' replies are in before this raises
            raise

    def _query(self, name: str, args: tuple) -> Any:
        key = (name, args) if len(args) == 1 and type(args[0]) is not list else _key(name, args)
        answers = self._answers
        if self._pending or self._queued or answers is None or key not in answers:
            self._known({key: (name, args)})
            answers = self._answers
        self._asking(key, (name, args))
        value = answers[key]
        if type(value) is Reply:
            value = _value(value)
        return list(value) if type(value) is list else value  # the caller's own list

    def _asking(self, key: tuple, call: tuple) -> None:
        """A query asked in this state (`_query`, `ahead`): it joins the snapshots after, and a lookup the recent
        ones."""
        if call[0] == "lookup_prefix" and len(call[1]) == 1 and isinstance(call[1][0], list | tuple):
            self._lookups.pop(key[1][0], None)
            self._lookups[key[1][0]] = None
        if self._asked is not None:
            self._asked[key] = call

    def _forget(self, seq: Any) -> None:
        self._seqs.pop(seq, None)
        self._named.pop(seq, None)
        for asked in (*self._window, *self._prefetched, self._asked or {}):
            for key in [k for k in asked if k[0] in SEQ_QUERIES and k[1] == (seq,)]:
                del asked[key]

    def _snapshot(self) -> dict:
        """{key: (name, args)}: before the first change, everything known (`SNAPSHOT_BLOCKS`); after it, the queries
        the caller asked in this state and the `WINDOW` states before it (a machine's rules ask different ones) and
        in its `PREFETCHED` latest prefetches; and those it said it expects (`expect`)."""
        if self._asked is not None:
            snapshot = {("block_table", (a,)): ("block_table", (a,)) for a in self._named}
            for asked in (*self._prefetched, *self._window):
                snapshot.update(asked)
            snapshot.update(self._asked)
        else:
            calls = [("num_free_blocks", ()), ("num_free_cpu_blocks", ())]
            if self._blocks <= SNAPSHOT_BLOCKS:
                calls += [("ref_count", (b,)) for b in range(self._blocks)]
            recent = list(self._lookups)[-RECENT_LOOKUPS:]
            calls += [(q, (s,)) for s in self._seqs for q in SEQ_QUERIES]
            snapshot = _keyed(calls + [("lookup_prefix", (list(t),)) for t in recent])
        snapshot.update(self._expected)
        self._expected = {}
        return snapshot

    def _fetch(self, calls: dict) -> dict:
        """The answers of ``calls`` ({key: call}) in this state, the queries asked ahead (`ahead`) in front."""
        ahead, self._ahead = _by_method(self._ahead), []
        calls = dict(_by_method(calls.items()))
        replies = self._m.process.call_many(self._m.handle, [*(call for call, _, _ in ahead), *calls.values()],
                                            self._limit)
        _resolve(ahead, replies)
        return dict(zip(calls, replies[len(ahead):], strict=True))

    def ahead(self, calls: list[tuple[str, tuple]], once: bool = False) -> Ahead:
        """These queries answered in this state: those not known yet go in front of the next message, a change's
        (the answers a step needs only once its change has returned cost no message of their own); ``once``: they
        join no snapshot after (`ahead`)."""
        box = Ahead(len(calls), self._send_ahead)
        answers = None if self._pending or self._queued else self._answers
        for i, call in enumerate(calls):
            key = _key(*call)
            if answers is not None and key in answers:
                box.answers[i] = answers[key]
            else:
                self._ahead.append((call, box, i))
            if not once:
                self._asking(key, call)
        return box

    def _send_ahead(self) -> None:
        """The queries asked ahead, answered now (nothing else to send them with)."""
        if self._ahead:
            self._known({})


def _query_method(name: str) -> Any:
    plain = name != "lookup_prefix"  # a lookup also joins the recent lookups (`Observed._query`)

    def query(self: Observed, *args: Any) -> Any:
        answers = self._answers
        if plain and answers is not None and not self._pending and len(args) == 1 and type(args[0]) is not list:
            key = (name, args)  # `_key`
            value = answers.get(key, answers)  # the dict itself: not an answer
            if value is not answers and type(value) is not Reply:  # answered in this state, a plain value
                if self._asked is not None:
                    self._asked[key] = key
                return list(value) if type(value) is list else value  # the caller's own list
        return self._query(name, args)

    query.__name__ = query.__qualname__ = name
    return query


for _name in QUERIES:  # methods, not looked up through __getattr__ and made anew at each of ~10^5 queries
    setattr(Observed, _name, _query_method(_name))


class Ahead:
    """The answers of queries asked of one state (`ahead`), read once the step needs them."""

    def __init__(self, n: int, send: Any = None) -> None:
        self.answers: list = [_UNANSWERED] * n
        self._send = send  # sends the queries still waiting for a message (`Observed._send_ahead`)

    def values(self) -> list:
        """Each query's answer (a list the caller's own); what the first one that raised raised is raised here."""
        if self._send is not None and _UNANSWERED in self.answers:
            self._send()
        return [list(v) if type(v) is list else v for v in map(_value, self.answers)]


_UNANSWERED = object()


def _raise_first(replies: list) -> None:
    """What the first of these changes' replies that is not a return raised (a violation raised as one)."""
    for reply in replies:
        if _failed(reply):
            raise reply.error if reply.kind == "raised" else ContractViolation(reply.payload)


def _by_method(entries: Any) -> list:
    """Queries of one state, those of one method together (in order otherwise): ``entries`` whose first item leads
    with the method's name, a snapshot's (key, call) items or the queries asked ahead, (call, its `Ahead`, its index
    there).  The call server takes a run of one method's calls as one group (`PluginProcess.post_many`), and a
    snapshot, a sequence's three queries after another's, made ~17 groups of ~2 calls a message; grouped, ~8 (~10%
    of a ci machine program's messaging CPU).  Queries change nothing (the contract): their order in a state is free."""
    return sorted(entries, key=_method)


def _method(entry: tuple) -> str:
    return entry[0][0]


def _resolve(ahead: list, replies: list) -> None:
    for (_, box, i), reply in zip(ahead, replies, strict=False):
        box.answers[i] = reply


def ahead(manager: Any, calls: list[tuple[str, tuple]], *, once: bool = False) -> Ahead:
    """The answers of these queries in the manager's state now, for a step that reads them only after its next
    change has returned: a manager in the implementation's process sends those it does not know yet in front of
    that change, in its message (an allocate's lookup of its new prompt: ~1,000 messages a ci machine run); another
    manager answers them now.  ``once``: the caller will not ask them of a later state, so they do not join the
    snapshots of the changes after it as queries asked of a state do (a machine's checks read a step late: its
    invariant's swap flags and lengths came back with every change's snapshot in case the step ended there, and
    34,300 of 44,300 never were read in a ci run of simple's machine_bookkeeping)."""
    if isinstance(manager, Observed):
        return manager.ahead(calls, once)
    box = Ahead(len(calls))
    for i, (name, args) in enumerate(calls):
        try:
            box.answers[i] = getattr(manager, name)(*args)
        except Exception as exc:  # noqa: BLE001 - the query's own answer, raised when read
            box.answers[i] = Reply("raised", error=exc)
    return box


def run_calls(manager: Any, calls: list[tuple[str, tuple]]) -> list[tuple[bool, Any]]:
    """Each ``(method, args)`` of ``calls`` on ``manager`` in order, with nothing asked between them: (True, what it
    returned) or (False, what it raised as "Type: message"), the calls after one that raised made all the same.  A
    manager in the implementation's process (`open_manager`, untimed) takes them in one message: the replay of a
    machine program's accepted calls on a fresh manager was ~2,400 round trips per ci run.  Their storage calls
    reach the storage in order, after the last call."""
    if isinstance(manager, Observed):
        return manager.run_calls(calls) if calls else []
    out = []
    for method, args in calls:
        try:
            out.append((True, getattr(manager, method)(*args)))
        except Exception as exc:  # noqa: BLE001 - each call's own answer, as the caller compares it
            out.append((False, _raised(exc)))
    return out


def prefetch(manager: Any, calls: list[tuple[str, tuple]]) -> None:
    """A manager in the implementation's process (`open_manager`, untimed) answers these queries of this state in
    one message, for a caller about to ask them all (a machine's invariants); another manager, nothing to do."""
    if isinstance(manager, Observed):
        manager.prefetch(calls)


def expect(manager: Any, calls: list[tuple[str, tuple]]) -> None:
    """A manager in the implementation's process brings these queries' answers back with the next change's reply,
    for a caller that will ask them right after it; another manager, nothing to do."""
    if isinstance(manager, Observed):
        manager.expect(calls)


def _sequences(name: str, args: tuple) -> tuple:
    """The arguments of a change that name sequences: fork's two, another's first (append's second is a token)."""
    return args[:2] if name == "fork" else args[:1]


def _raised(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _failed(answer: Any) -> bool:
    """Whether a call's answer (`PluginProcess.call_many`) is what it raised, or a violation."""
    return type(answer) is Reply and answer.kind != "ok"


def _value(answer: Any) -> Any:
    """What a call answered (`PluginProcess.call_many`): a plain value as it came, else its `Reply`'s value, or what
    it raised raised here."""
    if type(answer) is not Reply:
        return answer
    if answer.kind == "raised":
        raise answer.error
    if answer.kind != "ok":
        raise ContractViolation(answer.payload)
    return answer.value


def _keyed(calls: list[tuple[str, tuple]]) -> dict:
    """{`_key`: call} of each ``(name, args)``: the call itself where it is its key (no list among its arguments;
    ~10^5 a machine program)."""
    out = {}
    for call in calls:
        args = call[1]
        plain = type(call) is tuple and len(call) == 2 and (not args or len(args) == 1 and type(args[0]) is not list)
        out[call if plain else _key(call[0], args)] = call
    return out


def _key(name: str, args: tuple) -> tuple:
    if len(args) == 1:
        if type(args[0]) is not list:  # ref_count(b): ~10^5 a program
            return name, args
        return name, (tuple(args[0]),)  # lookup_prefix(tokens): ~3 10^4
    if not args:
        return name, args
    return name, tuple(tuple(a) if type(a) is list else a for a in args)


@contextlib.contextmanager
def deferred(manager: Any) -> Iterator[Any]:
    """Inside the block, a manager in the implementation's process (`open_manager`) is sent the changes that
    return nothing (`DEFERRABLE`) together, `QUEUED` at most in a message, without waiting for the reply: its next
    query or other change, or the block's end, sends those left and collects them, their storage calls replayed
    then, and raises what the first of them raised.  For callers that would let such an exception end them anyway
    and read no storage inside the block (a worked example's decode loop).  In-process, or for another manager,
    nothing changes."""
    observed = manager._manager if isinstance(manager, TimedManager) else manager
    if not isinstance(observed, Observed):
        yield manager
        return
    observed._deferred = True
    try:
        yield manager
    except BaseException:
        observed._deferred = False
        with contextlib.suppress(Exception):
            observed._collect()
        raise
    observed._deferred = False
    observed._collect()


def guarded_batch(impl: Impl, fn: Any) -> Any:
    """``fn()`` -- a batch of direct calls on an untimed manager (a state machine's step) -- under one guard: the
    per-call limit for the whole batch, global state compared around it.  A guard costs ~0.3 ms, ~50x a query,
    and a state machine makes ~10^5 calls.  What ``fn`` raises reaches the caller unchanged."""
    try:
        return guarded_call(fn, timeout_s=call_limit(impl), hang_owner=impl.fn)
    except ContractViolation as exc:
        if isinstance(exc.__cause__, Exception):
            raise exc.__cause__ from None
        raise


class TimedManager:
    """The manager, each contract method called through `guarded_call`: a hang is a verdict at once
    ("hung: ..."), not the whole process's limit; global state (RNGs, torch settings) is compared around every
    call.  What a method raises (OutOfBlocks, ValueError, KeyError) reaches the caller unchanged."""

    def __init__(self, impl: Impl, manager: Any):
        self._impl, self._manager = impl, manager

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._manager, name)
        if name not in METHODS:
            return method

        def timed(*args: Any, **kwargs: Any) -> Any:
            try:
                return guarded_call(method, *args, timeout_s=call_limit(self._impl), hang_owner=self._impl.fn,
                                    **kwargs)
            except ContractViolation as exc:
                if isinstance(exc.__cause__, Exception):  # the method raised: that exception is the answer
                    raise exc.__cause__ from None
                raise

        return timed
