"""The implementation's process: the implementation, and a small server that calls it for the judge.

`serve` runs in the implementation's process once harness/engine/confine.py has confined it (its own session, its
descriptors closed, its output captured, its address space capped, its own user id when the harness runs as root,
the marks of a test run removed): it loads the implementation and answers the judge's messages:

    ("q", id, released handles, "call", handle, method, args, kwargs, options)  -> ("r", id, kind, payload, sinks)
    ("q", id, released handles, "getattr", handle, name)                        -> ("r", id, kind, payload, [])
    ("q", id, released handles, "many", handle, groups, limit)  several calls of one object's methods, one guard
    ("q", id, released handles, "paths", ...)   a batch of enumeration runs (harness/sampling/enumeration.py)
    ("q", id, released handles, "paths_many", ...)   batches of several round states' runs in one message
    ("q", 0, [], "exit")

A call runs under `llm_inference_harness.engine.guard.guarded_call` here too (its alarm, the global-state comparison,
lists left unchanged); input tensors are views of the judge's arena, so the judge sees a mutation for itself.  What this
process reports is never trusted by the judge beyond being a well-formed message: it is the implementation's answer, and
the implementation could have written it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import itertools
import mmap
import os
import pickle
import socket
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from llm_inference_harness.engine import wire
from llm_inference_harness.engine.confine import where as _where

HANDED, HANDED_ITEMS = 256, 4096  # the latest lists handed over, up to this long, are watched for changes


def serve(conn: Connection, options: dict) -> None:
    """The implementation's process, confined (`llm_inference_harness.engine.confine.main`): load ``options["load"]``
    (``{"technique", "name"}`` or ``{"technique", "plugin"}``) and answer the judge until it says to exit."""
    server = Server(conn)
    if server.load(options["load"]):
        server.serve()


class JudgeObject:
    """An object the judge handed over by reference: calling it (or one of its methods) asks the judge; a sink's
    calls are recorded and replayed by the judge when the current call returns."""

    def __init__(self, server: Server, spec: wire.RefSpec) -> None:
        self._server, self._spec = server, spec

    def __getattr__(self, name: str) -> Any:
        for key, value in self._spec.attrs:
            if key == name:
                return value
        if name.startswith("_") or name not in self._spec.methods:
            raise AttributeError(f"{self._spec.type_name} object has no attribute {name!r} (it lives in the judge's "
                                 "process; only its methods can be called from here)")
        method = self.__dict__[name] = lambda *args, **kwargs: self._server.ask(self._spec, name, args, kwargs)
        return method  # kept: a storage's write is looked up once, not per call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._server.ask(self._spec, "__call__", args, kwargs)

    def __repr__(self) -> str:
        return f"<{self._spec.type_name} of the judge>"


class Server:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.objects: dict[int, Any] = {}
        self.handles: dict[int, int] = {}  # id(obj) -> handle
        self.next_handle = itertools.count(1)
        self.ids = itertools.count(1 << 40)  # callbacks: never equal to the judge's request ids
        self.maps: list[mmap.mmap] = []
        self.sink_calls: list = []
        self.handed: collections.deque = collections.deque(maxlen=HANDED)  # (list, its items, the method)
        self.models: dict = {}  # key -> (model, the path it was sent as, its state then)
        self.decoder = wire.Decoder(self.resolve, trusted=True, arena_map=lambda: self.maps[-1], values=self.value)
        self.state: list = [None]  # the global state after the last guarded call, if nothing has run since

    # -- loading ---------------------------------------------------------------------------------------------
    def load(self, load: dict) -> bool:
        from llm_inference_harness.engine.plugins import load_plugin
        from llm_inference_harness.engine.registry import get, info, load_elsewhere

        try:
            plugin = load.get("plugin")
            impl = load_elsewhere(load_plugin(plugin, load["technique"]) if plugin else get(load["technique"],
                                                                                              load["name"]))
        except BaseException as exc:  # noqa: BLE001 - a plugin that fails to load is a verdict, not a crash
            text = "".join(traceback.format_exception_only(exc)).strip()
            failure = getattr(exc, "failure", None)  # a plugins.PluginLoadError's: whose fault, where
            self.send(("load_failed", f"{_where(exc, load.get('plugin'))}{text}"[-4000:],
                       dataclasses.asdict(failure) if failure else None))
            return False
        declared = info(impl)
        self.objects[0] = impl.fn
        declared["methods"], declared["type_name"] = self.methods(impl.fn), type(impl.fn).__name__
        self.send(("loaded", self.encoder().encode(declared)))
        return True

    # -- the loop --------------------------------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            msg = self.receive()
            if msg[3] == "exit":
                return
            self.answer(msg)

    def receive(self) -> tuple:
        msg = wire.loads_untrusted(self.conn.recv_bytes())
        while msg == ("arena",):
            sock = socket.socket(fileno=os.dup(self.conn.fileno()))
            try:
                _, fds, _, _ = socket.recv_fds(sock, 1, 1)
            finally:
                sock.close()
            self.maps.append(mmap.mmap(fds[0], 0))
            os.close(fds[0])
            msg = wire.loads_untrusted(self.conn.recv_bytes())
        return msg

    def answer(self, msg: tuple) -> None:
        _, rid, released, op, *rest = msg
        for handle in released:
            obj = self.objects.pop(handle, None)
            if obj is not None:
                self.handles.pop(id(obj), None)
        extras: dict = {}
        if op not in ("call", "many"):
            self.state[0] = None  # its own code ran outside the guard: the next call reads the state afresh
        if op == "call":
            kind, payload = self.call(*rest, extras)
        elif op == "getattr":
            kind, payload = self.attribute(*rest)
        elif op == "many":
            kind, payload = "many", self.many(*rest)
        elif op == "paths":
            from llm_inference_harness.sampling.replay import run_paths

            kind, payload = "paths", run_paths(self, *rest)
        elif op == "paths_many":
            from llm_inference_harness.sampling.replay import run_paths_many

            kind, payload = "paths", run_paths_many(self, *rest)
        else:
            kind, payload = "violation", f"unknown request {op!r}"
        sinks, self.sink_calls = self.sink_calls, []
        self.send(("r", rid, kind, payload, sinks, extras))

    def call(self, handle: int, method: str, args: list, kwargs: list, options: dict, extras: dict) -> tuple[str, Any]:
        from llm_inference_harness.engine.guard import ContractViolation, guarded_call

        target = self.objects[handle]
        fn = target if method == "__call__" else getattr(target, method)
        args = [self.decoder.decode(a) for a in args]
        kwargs = {k: self.decoder.decode(v) for k, v in kwargs}
        if options.get("measure_memory"):
            fn = _measured(fn, extras)
        if "paths" in options:
            fn = _replayed(fn, options["paths"])
        known = self.state
        if "threads" in options or "torch_seed" in options:  # the judge's settings change the state: read afresh
            known = self.state[0] = None
        try:
            with _settings(options):
                out = guarded_call(fn, *args, timeout_s=options["timeout_s"], owns_torch_rng=options["owns_torch_rng"],
                                   compare_tensors=False, known_state=known, **kwargs)
        except ContractViolation as exc:
            cause = exc.__cause__
            if isinstance(cause, BaseException) and str(exc).startswith("raised "):
                return "raised", wire.encode_exception(cause)
            return "violation", str(exc)
        finally:
            changed = self.hand_over(method, [*args, *kwargs.values()]) or self.models_changed()
        if changed:
            return "violation", changed
        return "ok", self.encoder().encode(out)

    def hand_over(self, method: str, args: list) -> str:
        """The caller owns the lists it hands over: one the implementation kept and changed in a later call shows
        here (in-process the caller's own list would have changed).  Remembers this call's lists; '' if none of
        the earlier ones changed."""
        changed = self.handed_changed()
        if not changed:
            self.remember(method, args)
        return changed

    def remember(self, method: str, args: list) -> None:
        for a in args:
            if type(a) is list and len(a) <= HANDED_ITEMS:
                self.handed.append((a, tuple(a), method))

    def handed_changed(self) -> str:
        """'' unless a list handed over earlier and kept by the implementation has changed since."""
        if self.handed:
            watched = collections.deque(maxlen=HANDED)
            for kept, items, where in self.handed:
                if sys.getrefcount(kept) <= 3:  # this record, the loop, the call: nothing else holds it to change it
                    continue
                watched.append((kept, items, where))
                if len(kept) != len(items) or tuple(kept) != items:
                    shown = repr(list(items))[:200], repr(kept)[:200]
                    return (f"the list {shown[0]} handed to {where} became {shown[1]}: the implementation kept the "
                            "caller's list and changed it (inputs must be left unchanged; copy a list before keeping "
                            "it)")
            self.handed = watched
        return ""

    def many(self, handle: int, groups: list, timeout_s: float) -> list:
        """Several calls of one object's methods, in order, under one alarm.  A group is ``(method, "call", args,
        kwargs)``, ``(method, "none")``: the method once without arguments, or ``(method, "each", [a, b, ...])``: the
        method once per single argument (an int, a str, or a list of atoms: a lookup's tokens); its answer is
        ``("atoms", [...])`` when every call returned a plain value, else ``("each", [(kind, payload), ...])``.  A
        list handed over is watched as a call's are (`hand_over`) where the implementation kept it, and so are the
        earlier ones after a call of "call" or "none" (as each was a "call" before) and after a run of "each" (a
        change is charged to its last call)."""
        from llm_inference_harness.engine.guard import ContractViolation, guarded_call

        target, encode, decode = self.objects[handle], self.encoder().encode, self.decoder.decode

        def run() -> list:
            out = []
            for method, form, *rest in groups:
                call = getattr(target, method, None)
                answers, plain = [], True
                if form == "each":  # an int, a str or a list of atoms each (`PluginProcess.post_many`): ~10^5 a
                    handed = False  # machine program
                    for a in rest[0]:
                        kind, arg = type(a), a
                        if kind is list:  # a lookup's tokens: a copy each (pickle sends a list twice as one list)
                            arg = list(a)
                            held = sys.getrefcount(arg)
                        try:
                            value = call(arg)
                        except Exception as exc:  # noqa: BLE001 - each call's own answer
                            value, plain = _Raised(exc), False
                        if kind is list:  # checked once the run is done, watched from here if kept
                            if sys.getrefcount(arg) > held:  # the implementation holds it (or returned it)
                                self.remember(method, [arg])
                            handed = True
                        answers.append(value)
                    changed = handed and self.handed_changed()
                    if changed:  # charged to the run's last call (a list an earlier call kept, changed since)
                        answers[-1], plain = _Violation(changed), False
                else:
                    args, kwargs = (decode(rest[0]), decode(rest[1])) if form == "call" else ((), {})
                    try:
                        value = call(*args, **kwargs)
                    except Exception as exc:  # noqa: BLE001 - the call's own answer
                        value, plain = _Raised(exc), False
                    changed = self.hand_over(method, [*args, *kwargs.values()])
                    if changed:
                        value, plain = _Violation(changed), False
                    answers.append(value)
                if plain and wire.atoms_or_lists(answers):
                    out.append(("atoms", answers))
                else:
                    out.append(("each", [("raised", wire.encode_exception(v.exc)) if type(v) is _Raised else
                                         ("violation", v.text) if type(v) is _Violation else
                                         ("ok", encode(v)) for v in answers]))
            return out

        try:
            return guarded_call(run, timeout_s=timeout_s, compare_tensors=False, known_state=self.state)
        except ContractViolation as exc:
            return [("violation", str(exc))] * len(groups)

    def attribute(self, handle: int, name: str) -> tuple[str, Any]:
        try:
            return "ok", self.encoder().encode(getattr(self.objects[handle], name))
        except Exception as exc:  # noqa: BLE001 - the judge sees what reading it raised
            return "raised", wire.encode_exception(exc)

    def value(self, key, pickled: bytes | None, path: str, forget: list):
        """An object the judge sent by value; a model is kept, and named by its key when sent again, until the
        judge says to forget it (the judge keeps the latest `wire.KEPT_MODELS`: every kept model is checked for
        changes after every call)."""
        for old in forget:
            self.models.pop(tuple(old) if isinstance(old, list) else old, None)
        if pickled is None:
            return self.models[key][0]
        obj = pickle.loads(pickled)  # from the judge
        if key is not None:
            self.models[key] = (obj, path, wire.model_state(obj))
        return obj

    def models_changed(self) -> str:
        """'' unless a model the judge sent has changed (its weights replaced or written in place)."""
        for obj, path, state in self.models.values():
            now = wire.model_state(obj)
            if now != state:
                name = wire.changed_tensor_name(obj, state)
                return f"mutated its input {path}.{name} (inputs must be left unchanged; a model's weights too)"
        return ""

    # -- references ------------------------------------------------------------------------------------------
    def encoder(self) -> wire.Encoder:
        return wire.Encoder(self.handle_of)

    def handle_of(self, obj: Any) -> wire.RefSpec:
        if isinstance(obj, JudgeObject):
            return obj._spec
        handle = self.handles.get(id(obj))
        if handle is None:
            handle = next(self.next_handle)
            self.objects[handle], self.handles[id(obj)] = obj, handle
        return wire.RefSpec("impl", handle, self.methods(obj), type(obj).__name__)

    @staticmethod
    def methods(obj: Any) -> tuple[str, ...]:
        """Its public methods (called without a round trip to fetch them first); a callable attribute that is an
        object of its own (a model's module) is read as an attribute, becoming a reference of its own."""
        names = tuple(n for n in dir(obj) if not n.startswith("_") and inspect.isroutine(getattr(obj, n, None)))
        return names + (("__call__",) if callable(obj) else ())

    def resolve(self, spec: wire.RefSpec) -> Any:
        if spec.owner == "impl":
            return self.objects[spec.handle]
        return JudgeObject(self, spec)

    def ask(self, spec: wire.RefSpec, method: str, args: tuple, kwargs: dict) -> Any:
        """Call a method of a judge object: recorded if it is a sink, else a request answered by the judge."""
        if spec.sink:  # a storage's writes: ~10^5 in a worked example, plain ints each
            if not wire.atoms(args):
                self.sink_calls.append((spec.handle, method, self.encoder().encode(tuple(args))))
                return None
            last = self.sink_calls[-1] if self.sink_calls else None
            if last is not None and last[0] == spec.handle and last[1] == method and type(last[2]) is list:
                last[2].append(args)  # a run of one method's calls: their argument tuples in one list
            else:
                self.sink_calls.append((spec.handle, method, [args]))
            return None
        encoder = self.encoder()
        rid = next(self.ids)
        self.send(("q", rid, [], "call", spec.handle, method, encoder.encode(tuple(args)),
                   [(k, encoder.encode(v)) for k, v in kwargs.items()]))
        while True:
            msg = self.receive()
            if msg[0] == "r" and msg[1] == rid:
                if msg[2] == "raised":
                    raise wire.decode_exception(msg[3])
                return self.decoder.decode(msg[3])
            self.answer(msg)  # the judge called back in the meantime

    def send(self, tree: Any) -> None:
        self.conn.send_bytes(wire.dumps(tree))


class _Raised:
    """What one call of a batch raised (a query may return an exception object: that is its answer)."""

    __slots__ = ("exc",)

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


class _Violation:
    """A call of a batch after which a list handed over earlier had changed (`Server.hand_over`)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


@contextlib.contextmanager
def _settings(options: dict):
    """The judge's settings for this call: intra-op threads, torch's global seed (`remote_context`), the
    address-space headroom of a call that must refuse an oversized input (`address_space_headroom`)."""
    import torch

    from llm_inference_harness.engine.memory import address_space_headroom

    threads = torch.get_num_threads()
    if "threads" in options:
        torch.set_num_threads(options["threads"])
    if "torch_seed" in options:
        torch.manual_seed(options["torch_seed"])
    try:
        with address_space_headroom(options["headroom"]) if "headroom" in options else contextlib.nullcontext():
            yield
    finally:
        torch.set_num_threads(threads)


def _replayed(fn, paths: list):
    """``fn`` once per path of scripted draws, its ``rng`` a replay of the path: each run's report, the output with
    the draws made (harness/sampling/replay.py), or what it raised (the last report)."""
    from llm_inference_harness.sampling.replay import ReplayRng

    def runs(*args, **kwargs):
        reports = []
        for path in paths:
            rng = ReplayRng(path)
            try:
                out = fn(*args, rng=rng, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the judge raises it, as a call's own exception
                reports.append(("raised", wire.encode_exception(exc)))
                break
            reports.append(("run", out, rng.depth, [(list(map(float, w)), c, t) for w, c, t in rng.new]))
        return reports

    return runs


def _measured(fn, extras: dict):
    """``fn`` under a tensor-memory meter (the judge's meter is on): its peak and largest allocation reported."""
    from llm_inference_harness.engine.memory import TensorMemory

    def measured(*args, **kwargs):
        with TensorMemory() as meter:
            try:
                return fn(*args, **kwargs)
            finally:
                extras["memory"] = (meter.peak, meter.largest)

    return measured
