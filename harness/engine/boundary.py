"""The judge's side of the boundary: the implementation's process, and the proxies the properties call.

The judge never imports the code it judges.  `PluginProcess.start` forks a process (from a process that has
computed nothing yet: the judge's child before its first case, or a zygote), confines it (harness/engine/confine.py)
and hands it to what the caller passes: the call server (harness/engine/callserver.py), which loads the
implementation and serves calls.  The judge builds an `Impl` record from what that process
declares, with ``fn`` a `Remote` proxy: calling it is a message; what comes back is copied into the judge's
memory through harness/engine/wire.py.  The judge keeps every input and checks, itself, after each call:

* the call's reply within its limit (else the process is killed: ``hung``), the process alive (else ``crashed``,
  with its exit status), the reply well formed (else ``crashed: ... malformed``);
* the inputs unchanged: the shared arena holding the implementation's view of each input tensor is compared with
  the judge's own copy.

The process is started with PR_SET_PDEATHSIG: it never outlives the process that started it; the judge ends its
process group (the implementation's own children included) when it is done or the call hung.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import ctypes
import itertools
import os
import select
import shutil
import signal
import socket
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from llm_inference_harness.engine import confine, isolation, wire
from llm_inference_harness.engine.confine import PLUGIN_UID_BASE
from llm_inference_harness.engine.guard import Crashed, Hung, Remote

GRACE_S = 3.0  # past a call's own limit: the alarm inside the implementation's process gets the first chance
PR_SET_DUMPABLE = 4

# Settings of the implementation's process for the calls made inside a `remote_context` block: torch's
# intra-op threads (a determinism property runs a call at several counts), torch's global seed (a sampler that
# owns torch's RNG gets the same seed in every run of a determinism check).
_context: contextvars.ContextVar[tuple] = contextvars.ContextVar("remote_context", default=())


@contextlib.contextmanager
def remote_context(**settings: Any) -> Iterator[None]:
    token = _context.set((*_context.get(), *settings.items()))
    try:
        yield
    finally:
        _context.reset(token)


@dataclass
class Started:
    """What the implementation's process said once it had loaded the implementation."""

    info: dict  # name, technique, mutant, caps, ... as runner._info builds them
    fn: Any  # the Remote proxy of the loaded object


class PluginProcess:
    """One implementation's process and the judge's end of the conversation with it."""

    def __init__(self, conn: Connection, pid: int, capture: str, arena: wire.Arena, waiter: Callable[[], str]) -> None:
        self.conn, self.pid, self.capture, self.arena, self.waiter = conn, pid, capture, arena, waiter
        self.refs: dict[int, Any] = {}  # the judge's objects the implementation holds references to
        self.ref_ids: dict[int, int] = {}  # id(obj) -> handle
        self.next_handle = itertools.count(1)
        self.ids = itertools.count(1)
        self.released: list[int] = []  # handles of the implementation's objects the judge dropped
        self.proxies: weakref.WeakValueDictionary[int, Remote] = weakref.WeakValueDictionary()
        self.dead = ""  # why it stopped, once it has
        self.arena_generation = -1  # the implementation's process has no arena yet: sent with the first request
        self.decoder = wire.Decoder(self.resolve, trusted=False)
        self.impl_fn: Any = None  # the proxy of the loaded implementation (hangs are charged to it)
        self.call_limit_s = 20.0  # its declared per-call limit, once loaded
        self.home = ""  # its home when it runs under a user id of its own
        self.last_inputs: wire.Encoder | None = None
        self.posted: set[int] = set()  # requests sent whose replies have not been collected
        self.requests = 0  # requests sent, callbacks' replies not counted (benchmarks/bench_check.py, MachineRequests)
        # models sent by value, by `wire.value_key`: named, not sent, the next time (the latest wire.KEPT_MODELS)
        self.sent: collections.OrderedDict = collections.OrderedDict()
        self.early: dict[int, tuple] = {}  # replies that came while the judge waited for another
        self.poller = select.poll()  # registered once: Connection.poll builds a selector at every call (~4 us)
        self.poller.register(conn.fileno(), select.POLLIN)
        self.colocated = False  # kept on the judge's CPU while batches go back and forth (or on one CPU anyway)

    # -- starting --------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, load: dict, serve: Callable[[Connection, dict], None], *, capture: str, memory_bytes: int = 0,
              one_thread: bool = False, spawn: Callable | None = None) -> PluginProcess:
        """Fork the implementation's process (or ask ``spawn``, a zygote, which serves with the call server) and,
        once it is confined (harness/engine/confine.py), let ``serve(its channel, options)`` load ``load``
        (``{"technique", "name"}`` or ``{"technique", "plugin"}``: the call server's `serve`; ``{"describe":
        module}``: the registry's probe) and answer."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        arena = wire.Arena()
        root = os.geteuid() == 0
        home = tempfile.mkdtemp(prefix="harness-plugin-") if root else ""
        if not root:  # the implementation runs as this user: keep it out of this process's memory (/proc/pid/mem)
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        options = {"capture": capture, "memory_bytes": memory_bytes, "one_thread": one_thread, "load": load,
                   "home": home}
        if spawn is None:
            parent = os.getpid()
            pid = os.fork()
            if pid == 0:  # the implementation's process: never returns
                mine.close()
                confine.main(theirs.detach(), parent, options, serve)
            waiter = lambda: _wait_child(pid)  # noqa: E731
        else:
            pid, waiter = spawn(theirs.fileno(), options)
        theirs.close()
        conn = Connection(mine.detach())
        process = cls(conn, pid, capture, arena, waiter)
        process.home = home
        return process

    def described(self, limit_s: float) -> list[dict]:
        """What a `{"describe": module}` process found its module registers (plain records)."""
        msg = self.receive(time.monotonic() + limit_s)
        if msg[0] == "load_failed":
            raise LoadFailed(str(msg[1]))
        records = self.decoder.decode(msg[1]) if msg[0] == "described" else None
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise self.crash("crashed: the process importing it described something that is not a list of records")
        return records

    def hello(self, limit_s: float) -> Started:
        """Wait for the loaded implementation's declaration (or why loading failed)."""
        try:
            msg = self.receive(time.monotonic() + limit_s)
        except Hung:
            raise Hung(f"hung: not imported and registered within the import limit of {limit_s:g} s "
                       "(HARNESS_IMPORT_LIMIT_S)") from None
        if msg[0] == "loaded":
            info = self.decoder.decode(msg[1])
            if not isinstance(info, dict):
                raise Crashed("the implementation's process declared something that is not a record")
            return Started(info, self.resolve(wire.RefSpec("impl", 0, tuple(info.pop("methods", ())),
                                                           str(info.get("type_name", "")))))
        if msg[0] == "load_failed":
            raise LoadFailed(str(msg[1]), _load_failure(msg[2] if len(msg) > 2 else None))
        raise Crashed(f"the implementation's process sent {msg[0]!r} before declaring the implementation")

    # -- references ------------------------------------------------------------------------------------------
    def resolve(self, spec: wire.RefSpec) -> Any:
        if spec.owner == "judge":
            try:
                return self.refs[spec.handle]
            except KeyError:
                raise wire.Malformed(f"a reference to judge object {spec.handle}, which it never handed over") from None
        if spec.owner != "impl":
            raise wire.Malformed(f"a reference owned by {spec.owner!r}")
        proxy = self.proxies.get(spec.handle)
        if proxy is None:  # one proxy per object over there: the object is released when the last one dies
            if spec.handle in self.released:
                self.released.remove(spec.handle)  # dropped, but not released yet: it lives on
            proxy = self.proxies[spec.handle] = Remote(self, spec.handle, spec.methods, spec.type_name)
        return proxy

    def handle_of(self, obj: Any) -> wire.RefSpec:
        """A judge object the implementation will hold by reference (an LM it calls, a storage it writes to)."""
        if isinstance(obj, Remote):
            if obj.process is not self:
                raise TypeError("an object of another implementation's process cannot be passed here")
            return wire.RefSpec("impl", obj.handle, obj.methods, obj.type_name)
        handle = self.ref_ids.get(id(obj))
        if handle is None:
            handle = next(self.next_handle)
            self.refs[handle], self.ref_ids[id(obj)] = obj, handle
        public = [(n, getattr(obj, n, None)) for n in dir(obj) if not n.startswith("_")]
        methods = tuple(n for n, v in public if callable(v)) + (("__call__",) if callable(obj) else ())
        attrs = tuple((n, v) for n, v in public if type(v) in wire.PLAIN_ATOMS or isinstance(v, torch.dtype))
        return wire.RefSpec("judge", handle, methods, type(obj).__name__, bool(getattr(obj, "harness_sink", False)),
                            attrs)

    # -- calls -----------------------------------------------------------------------------------------------
    def call(self, handle: int, method: str, args: tuple, kwargs: dict, *, timeout_s: float,
             arg_names: tuple[str, ...] = (), owns_torch_rng: bool = False, paths: list | None = None) -> Reply:
        """One call, its inputs through the arena; the reply as it came, the inputs checked afterwards.  The last
        call's inputs are compared once more first: an implementation that left a thread writing into them after
        it returned is caught here, before the arena is reused.  ``paths``: the call once per path of scripted
        draws, its ``rng`` a replay of that path over there, under one guard (`Server.call`): the reply's value is
        the list of the runs' reports."""
        from llm_inference_harness.sampling.lm import TorchRng

        release_cpus()
        if self.last_inputs is not None:
            late, self.last_inputs = wire.changed_inputs(self.last_inputs), None
            if late:
                return Reply("violation", payload=f"changed its input {late[0]} after the call had returned (a thread "
                                                  "it left running?): inputs must be left unchanged")
        while True:
            self.arena.reset()
            encoder = wire.Encoder(self.handle_of, self.arena, by_value=(_module_type(), TorchRng), sent=self.sent)
            try:
                named = {**{(arg_names[i] if i < len(arg_names) else f"argument {i}"): a
                            for i, a in enumerate(args)}, **kwargs}
                trees = {k: encoder.encode(v, k) for k, v in named.items()}
                break
            except wire.ArenaFull as full:
                self.arena.grow(full.needed)
        positional = [trees[k] for k in list(named)[: len(args)]]
        keywords = [(k, trees[k]) for k in list(named)[len(args):]]
        from llm_inference_harness.engine.memory import HEADROOM, METERS

        meters, headroom = METERS.get(), HEADROOM.get()
        options = {"timeout_s": timeout_s, "owns_torch_rng": owns_torch_rng, **dict(_context.get()),
                   **({"paths": paths} if paths is not None else {}),
                   **({"measure_memory": True} if meters else {}), **({"headroom": headroom} if headroom else {})}
        reply = self.request(("call", handle, method, positional, keywords, options), timeout_s + GRACE_S)
        reply.mutated = wire.changed_inputs(encoder)
        self.last_inputs = None if reply.mutated else encoder  # a mutation is reported once, with this call
        memory = reply.extras.get("memory")
        if meters and isinstance(memory, tuple) and len(memory) == 2 and all(type(n) is int for n in memory):
            for meter in meters:
                meter.add_remote(*memory)
        return reply

    def call_many(self, handle: int, calls: list[tuple], timeout_s: float,
                  then: Callable[[list], None] | None = None) -> list:
        """Several calls ``(method, args[, kwargs])`` of one object's methods in one message, in order, under one
        limit (a manager's step and its observables after it); inputs copied.  Each call's answer is a plain value
        when it returned one (an atom or a list of atoms, checked as such: a state machine's ~10^5 queries make no
        object each), else its `Reply` as `call` gives it (what it raised, a violation, any other value).  Runs of
        one method over single plain arguments (an int, a str, a list of atoms) travel as one list, and so do their
        plain answers.  ``then(answers)`` runs before the calls the batch made on the judge's sinks are replayed (a
        storage that reads the manager's counts as it replays its writes reads them after the batch, from these
        answers)."""
        return self.finish_many(self.post_many(handle, calls, timeout_s), then)

    def post_many(self, handle: int, calls: list[tuple], timeout_s: float) -> tuple:
        """`call_many`'s message sent; `finish_many` collects its replies (later messages may be sent meanwhile)."""
        if not self.colocated:
            self._colocate()
        groups: list[tuple] = []
        each_method, each_items, encoder = None, [], None  # the last group, when a single argument may join it
        for call in calls:
            method, args = call[0], call[1]
            kwargs = call[2] if len(call) > 2 else None
            item = None
            if not kwargs and len(args) == 1:
                a = args[0]
                kind = type(a)
                if kind is int or kind is str:
                    item = a
                elif kind is list and wire.atoms(a):  # a lookup's tokens, pickled before this returns
                    item = a
            elif not kwargs and not args:  # a count
                groups.append((method, "none"))
                each_method = None
                continue
            if item is not None:
                if method == each_method:
                    each_items.append(item)
                else:
                    each_method, each_items = method, [item]
                    groups.append((method, "each", each_items))
                continue
            encoder = encoder or wire.Encoder(self.handle_of, None)
            groups.append((method, "call", encoder.encode(tuple(args)), encoder.encode(dict(kwargs or {}))))
            each_method = None
        sizes = [len(g[2]) if g[1] == "each" else 1 for g in groups]
        return self.post(("many", handle, groups, timeout_s)), len(calls), sizes, timeout_s

    def _colocate(self) -> None:
        """Run this process and the implementation's on one CPU while batches of small calls go back and forth (a
        state machine: ~6,000 messages a run).  They take turns: neither computes while the other does, and waking
        the other on an idle CPU costs more than the message (a one-query batch's round trip on this project's
        2-vCPU machine: 160-190 us across the two, 50-80 us on one).  The CPU is this checking process's slot's
        (`isolation.slot`: children running at once get different ones), else the one it runs on now (the kernel
        spreads busy processes).  `release_cpus` gives both their CPUs back (a tensor call, the property's end)."""
        global _judge_cpus
        self.colocated = True
        cpus = sorted(os.sched_getaffinity(0)) if _judge_cpus is None else _judge_cpus
        slot = isolation.slot()
        cpu = cpus[slot % len(cpus)] if slot is not None else _sched_getcpu()
        if len(cpus) < 2 or cpu not in cpus:
            return
        with contextlib.suppress(OSError):  # a process the kernel will not move: only speed is lost
            os.sched_setaffinity(self.pid, {cpu})
            os.sched_setaffinity(0, {cpu})
            _judge_cpus = cpus
            _pinned.add(self)

    def finish_many(self, ticket: tuple, then: Callable[[list], None] | None = None) -> list:
        rid, count, sizes, timeout_s = ticket
        answers: list = []

        def ready(reply: Reply) -> None:
            groups = reply.value if reply.kind == "many" else None
            if type(groups) is not list or len(groups) != len(sizes):
                raise self.crash("crashed: the implementation's process answered a batch of calls with something else")
            for group, size in zip(groups, sizes, strict=True):
                if type(group) is Reply and group.kind == "violation":  # the batch's guard: each call's answer
                    answers.extend([group] * size)
                elif len(group) == size:
                    answers.extend(group)
                else:
                    raise self.crash("crashed: the implementation's process answered a batch of calls with something "
                                     "else")
            if len(answers) != count:
                raise self.crash("crashed: the implementation's process answered a batch of calls with something else")
            if then is not None:
                then(answers)

        self.wait(rid, timeout_s + GRACE_S, before_sinks=ready)
        return answers

    def _group(self, entry: Any) -> list | Reply:
        """A group's answers: the list of plain values as it came (each checked), a violation of the whole batch,
        or each answer's `Reply`."""
        form, payload = entry
        if form == "atoms":
            values = wire._seq(payload, list)
            if not wire.atoms_or_lists(values):
                raise wire.Malformed("a list of atoms holds something else")
            return values
        if form == "violation":
            return Reply("violation", payload=str(payload)[:4000])
        return [self._one(e) for e in wire._seq(payload, list)]

    def _one(self, entry: Any) -> Reply:
        kind, payload = entry
        if kind == "ok":
            return Reply("ok", value=self.decoder.decode(payload))
        if kind == "raised":
            return Reply("raised", error=wire.decode_exception(payload))
        return Reply("violation", payload=str(payload)[:4000])

    def getattr(self, handle: int, name: str, timeout_s: float) -> Any:
        reply = self.request(("getattr", handle, name), timeout_s + GRACE_S)
        if reply.kind != "ok":
            raise reply.exception() if reply.kind == "raised" else AttributeError(reply.payload)
        return reply.value

    def request(self, message: tuple, limit_s: float, before_sinks: Callable[[Reply], None] | None = None) -> Reply:
        return self.wait(self.post(message), limit_s, before_sinks)

    def post(self, message: tuple) -> int:
        """Send a request without waiting for its reply (`wait` collects it): the judge's own work can overlap
        the implementation's (an enumeration settles one batch of runs while the next is run)."""
        if self.dead:
            raise Crashed(self.dead)
        rid = next(self.ids)
        if self.arena.generation != self.arena_generation:
            self._send_arena()
        released, self.released = self.released, []
        self.send(("q", rid, released, *message))
        self.posted.add(rid)
        self.requests += 1
        return rid

    def wait(self, rid: int, limit_s: float, before_sinks: Callable[[Reply], None] | None = None) -> Reply:
        """The reply to request ``rid``, serving the implementation's calls back meanwhile.  Anything that
        interrupts the wait (a judge-side alarm, Ctrl-C) leaves the conversation unreadable: the process is ended."""
        deadline = time.monotonic() + limit_s
        try:
            while rid not in self.early:
                msg = self.receive(deadline)
                if msg[0] == "r" and type(msg[1]) is int and msg[1] in self.posted:
                    self.early[msg[1]] = msg
                elif msg[0] == "q":  # the implementation calls back into an object the judge handed it
                    self._serve(msg)
                else:
                    raise self.crash(f"crashed: the implementation's process sent an unexpected {str(msg[0])[:40]!r} "
                                     "message")
        except BaseException:
            if not self.dead:
                self.kill()
                self.dead = "stopped: the judge stopped waiting for a reply"
            raise
        self.posted.discard(rid)
        return self._reply(self.early.pop(rid), before_sinks)

    def _reply(self, msg: tuple, before_sinks: Callable[[Reply], None] | None = None) -> Reply:
        """The reply decoded; ``before_sinks(reply)``; then the calls its request made on the judge's sinks
        replayed, in order."""
        try:
            _, _, kind, payload, sink_calls, extras = msg
            if type(extras) is not dict:
                raise wire.Malformed("a reply's extras must be a dict")
            if kind == "ok":
                reply = Reply("ok", value=self.decoder.decode(payload), extras=extras)
            elif kind == "paths":  # the enumeration's runner checks every entry (harness/sampling/replay.py)
                reply = Reply("paths", value=payload)
            elif kind == "many":
                reply = Reply("many", value=[self._group(entry) for entry in wire._seq(payload, list)])
            elif kind == "raised":
                reply = Reply("raised", error=wire.decode_exception(payload), extras=extras)
            elif kind == "violation":
                reply = Reply("violation", payload=str(payload)[:4000], extras=extras)
            else:
                raise wire.Malformed(f"a reply of kind {kind!r}")
            sinks = wire._seq(sink_calls, list)
        except (wire.Malformed, KeyError, ValueError, TypeError) as exc:
            raise self.crash(f"crashed: the implementation's process sent a malformed reply ({exc})") from None
        if before_sinks is not None:
            before_sinks(reply)
        try:
            bound: dict = {}  # (handle, method) -> the judge's method, looked up once per reply
            for handle, method, args in sinks:  # replayed in order, on the judge's object
                fn = bound.get((handle, method))
                if fn is None:
                    obj = self.refs[handle]
                    if not getattr(obj, "harness_sink", False) or method.startswith("_"):
                        raise wire.Malformed(f"a recorded call {method!r} on an object that records none")
                    fn = bound[(handle, method)] = getattr(obj, method)
                if type(args) is not list:  # one call's arguments, encoded
                    fn(*self.decoder.decode(args))
                    continue
                if not wire.rows_of_atoms(args):  # consecutive calls' plain arguments (a storage's writes)
                    raise wire.Malformed("a recorded call's arguments that are not plain values")
                for row in args:
                    fn(*row)
        except (wire.Malformed, KeyError, ValueError, TypeError) as exc:
            raise self.crash(f"crashed: the implementation's process sent a malformed reply ({exc})") from None
        return reply

    def _serve(self, msg: tuple) -> None:
        """A call from the implementation's process on one of the judge's objects (a callback)."""
        try:
            _, rid, _released, op, handle, method, args, kwargs = msg[:8]
            obj = self.refs[handle]
            if op != "call" or (method != "__call__" and (method.startswith("_") or not hasattr(obj, method))):
                raise wire.Malformed(f"a callback {op} {method!r}")
            fn = obj if method == "__call__" else getattr(obj, method)
            args = self.decoder.decode(args)
            kwargs = {wire._str(k): self.decoder.decode(v) for k, v in wire._seq(kwargs, list)}
        except (wire.Malformed, KeyError, ValueError, TypeError) as exc:
            raise self.crash(f"crashed: the implementation's process sent a malformed callback ({exc})") from None
        encoder = wire.Encoder(self.handle_of, None, by_value=())
        try:
            self.send(("r", rid, "ok", encoder.encode(fn(*args, **kwargs)), [], {}))
        except Exception as exc:  # noqa: BLE001 - the judge's object raised: the implementation sees it
            self.send(("r", rid, "raised", wire.encode_exception(exc), [], {}))

    # -- the channel -----------------------------------------------------------------------------------------
    def send(self, tree: tuple) -> None:
        try:
            self.conn.send_bytes(wire.dumps(tree))
        except OSError:
            raise self.crash(self._death()) from None

    def receive(self, deadline: float) -> tuple:
        try:
            while not self.poller.poll(max(0.0, min(1000.0, (deadline - time.monotonic()) * 1000.0))):
                if time.monotonic() >= deadline:
                    self.kill()
                    self.dead = "hung: no reply within the per-call limit; the implementation's process was killed"
                    raise Hung(self.dead)
            data = self.conn.recv_bytes()
        except (EOFError, OSError):
            raise self.crash(self._death()) from None
        try:
            msg = wire.loads_untrusted(data)
        except wire.Malformed as exc:
            raise self.crash(f"crashed: the implementation's process sent a malformed message ({exc})") from None
        if type(msg) is not tuple or not msg or type(msg[0]) is not str:
            raise self.crash("crashed: the implementation's process sent a message that is not a tagged tuple")
        return msg

    def _send_arena(self) -> None:
        self.conn.send_bytes(wire.dumps(("arena",)))
        sock = socket.socket(fileno=os.dup(self.conn.fileno()))
        try:
            socket.send_fds(sock, [b"A"], [self.arena.fd])
        finally:
            sock.close()
        self.arena_generation = self.arena.generation

    def crash(self, why: str) -> Crashed:
        self.kill()
        self.dead = why
        return Crashed(why)

    def _death(self) -> str:
        status = self.waiter()
        return f"crashed: the implementation's process {status}" if status else \
            "crashed: the implementation's process closed its end of the channel"

    def kill(self) -> None:
        """End the implementation's process group: SIGKILL (it has had its alarm and its grace)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        if self in _pinned:
            release_cpus()
        if not self.dead:
            with contextlib.suppress(OSError):
                self.conn.send_bytes(wire.dumps(("q", 0, [], "exit")))
        self.kill()
        self.waiter()
        self.conn.close()
        self.dead = self.dead or "closed"
        if self.home:  # whatever still runs under its user id (a daemon it started) ends with it
            kill_user(PLUGIN_UID_BASE + self.pid)
            shutil.rmtree(self.home, ignore_errors=True)


class LoadFailed(Exception):
    """The implementation could not be loaded (its import raised, its declaration is invalid); ``failure``:
    the fields of a llm_inference_harness.engine.plugins.LoadFailure when a plugin spec was loaded."""

    def __init__(self, text: str, failure: dict | None = None) -> None:
        super().__init__(text)
        self.failure = failure


LOAD_FAILURE_FIELDS = {"spec": str, "fault": str, "exception": str, "file": str, "line": (int, type(None)),
                       "trace": str}


def _load_failure(fields: object) -> dict | None:
    """A LoadFailure's fields as the implementation's process reported them, only if they have the declared
    types (it says why its own plugin failed to load: a wrong report changes that FAIL's message, nothing more)."""
    if type(fields) is not dict or set(fields) != set(LOAD_FAILURE_FIELDS):
        return None
    if not all(isinstance(fields[k], t) for k, t in LOAD_FAILURE_FIELDS.items()) or fields["fault"] not in (
            "plugin", "command"):
        return None
    return {k: (v[:4000] if isinstance(v, str) else v) for k, v in fields.items()}


_sched_getcpu = getattr(ctypes.CDLL(None), "sched_getcpu", lambda: -1)
_judge_cpus: list[int] | None = None  # this process's CPUs while `PluginProcess._colocate` keeps it on one
_pinned: weakref.WeakSet = weakref.WeakSet()  # the implementations' processes kept on its CPU


def release_cpus() -> None:
    """This process and the implementations' processes `PluginProcess._colocate` kept on one CPU get back the
    CPUs this process had."""
    global _judge_cpus
    if _judge_cpus is None:
        return
    for process in list(_pinned):
        with contextlib.suppress(OSError):
            if not process.dead:
                os.sched_setaffinity(process.pid, _judge_cpus)
        process.colocated = False
    _pinned.clear()
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, _judge_cpus)
    _judge_cpus = None


def _wait_child(pid: int) -> str:
    """How a child of this process ended ('' if it is still running after a short wait)."""
    for _ in range(50):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return ""
        if done:
            return describe_status(status)
        time.sleep(0.01)
    return ""


def kill_user(uid: int) -> None:
    """SIGKILL every process running under ``uid``."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                with open(f"/proc/{name}/status") as f:
                    line = next(x for x in f if x.startswith("Uid:"))
                if int(line.split()[1]) == uid:
                    os.kill(int(name), signal.SIGKILL)


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with code {os.WEXITSTATUS(status)}"


def _module_type() -> type:
    import torch

    return torch.nn.Module


class Reply:
    """A reply as it came: kind "ok" | "raised" | "violation" (and "many", "paths" as sent), with its value, the
    exception raised, a violation's text, extras, and the inputs found changed.  A plain class: a batch of queries
    makes one per answer (~10^5 a state-machine program)."""

    __slots__ = ("kind", "value", "error", "payload", "extras", "mutated")

    def __init__(self, kind: str, value: Any = None, error: BaseException | None = None, payload: str = "",
                 extras: dict | None = None, mutated: list[str] | None = None) -> None:
        self.kind, self.value, self.error, self.payload = kind, value, error, payload
        self.extras = {} if extras is None else extras
        self.mutated = mutated

    def exception(self) -> BaseException:
        return self.error
