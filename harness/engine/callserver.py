"""The implementation's process: the implementation, and a small server that calls it for the judge.

`main` runs in a freshly forked child and never returns.  It dies with its parent (PR_SET_PDEATHSIG), becomes its
own session and process group, closes every descriptor but its channel, sends its output to a capture file, caps
its address space and, when the harness runs as root, drops to a user id of its own (no access to the judge's
memory, files or processes; `plugin_uid`).  Then it loads the implementation and answers the judge's messages:

    ("q", id, released handles, "call", handle, method, args, kwargs, options)  -> ("r", id, kind, payload, sinks)
    ("q", id, released handles, "getattr", handle, name)                        -> ("r", id, kind, payload, [])
    ("q", id, released handles, "paths", ...)   a batch of enumeration runs (harness/sampling/enumeration.py)
    ("q", 0, [], "exit")

A call runs under `llm_inference_harness.engine.guard.guarded_call` here too (its alarm, the global-state comparison,
lists left unchanged); input tensors are views of the judge's arena, so the judge sees a mutation for itself.  What this
process reports is never trusted by the judge beyond being a well-formed message: it is the implementation's answer, and
the implementation could have written it.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import inspect
import itertools
import mmap
import os
import pickle
import resource
import socket
import struct
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from llm_inference_harness.engine import wire
from llm_inference_harness.engine.boundary import PLUGIN_UID_BASE

HANDED, HANDED_ITEMS = 256, 4096  # the latest lists handed over, up to this long, are watched for changes
PR_SET_KEEPCAPS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 8, 38, 47, 2
CAP_DAC_READ_SEARCH = 2
_CAPABILITY_VERSION_3 = 0x20080522


def main(fd: int, parent: int, options: dict) -> None:
    """The implementation's process; exits, never returns."""
    code = 0
    try:
        from llm_inference_harness.engine.isolation import die_with_parent

        die_with_parent(parent)
        os.setsid()
        _keep_only(fd)
        _capture(options["capture"])
        if options.get("memory_bytes"):
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            cap = _address_space() + options["memory_bytes"]
            cap = cap if hard == resource.RLIM_INFINITY else min(cap, hard)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        if options.get("home"):
            plugin_uid(options["home"])
            die_with_parent(parent)  # a change of user id clears the parent-death signal: set it again
        _unmark()
        if options.get("one_thread"):
            import torch

            torch.set_num_threads(1)
        server = Server(Connection(fd))
        if server.load(options["load"]):
            server.serve()
    except BaseException:  # noqa: BLE001 - the judge reads it in the capture and sees the channel close
        traceback.print_exc()
        code = 70
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# What tells a process it is under test: the judge's environment and test frameworks.  Gone before the
# implementation is imported (it may import them itself; then they are fresh, and say nothing of the judge).
_TEST_MARKS = ("PYTEST_", "HYPOTHESIS", "HARNESS_", "CI", "GITHUB_", "TOX_", "_PYTEST")


def _unmark() -> None:
    for name in [n for n in os.environ if n.startswith(_TEST_MARKS)]:
        del os.environ[name]
    for name in [n for n in sys.modules if n.split(".")[0] in ("pytest", "_pytest", "hypothesis", "xdist",
                                                                   "pluggy", "execnet")]:
        del sys.modules[name]


def _keep_only(fd: int) -> None:
    """Close every descriptor this process inherited but the channel (the judge's pipe to its own parent, its
    capture file, anything): nothing the implementation can reach leads out of this process but the channel."""
    for name in os.listdir("/proc/self/fd"):
        n = int(name)
        if n > 2 and n != fd:
            with contextlib.suppress(OSError):
                os.close(n)


def _capture(path: str) -> None:
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def plugin_uid(home: str) -> None:
    """Drop root: a user id no other process has, a home (and caches) of its own, and of root's powers only
    CAP_DAC_READ_SEARCH (read any file: the interpreter's standard library may live under /root).  From here the
    implementation can write only its home and /tmp, cannot signal, trace or read the memory of the judge, and
    cannot regain root by running a setuid program (PR_SET_NO_NEW_PRIVS)."""
    uid = PLUGIN_UID_BASE + os.getpid()
    os.chown(home, uid, uid)
    os.environ.update(HOME=home, TMPDIR=home, XDG_CACHE_HOME=os.path.join(home, ".cache"), USER="harness-plugin",
                      LOGNAME="harness-plugin", TRITON_CACHE_DIR=os.path.join(home, ".triton"),
                      TORCHINDUCTOR_CACHE_DIR=os.path.join(home, ".inductor"))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    mask = 1 << CAP_DAC_READ_SEARCH
    header = ctypes.create_string_buffer(struct.pack("Ii", _CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(struct.pack("IIIIII", mask, mask, mask, 0, 0, 0))  # effective, permitted,
    if libc.capset(header, data) != 0:  # inheritable: the low word holds CAP_DAC_READ_SEARCH, the high word none
        raise OSError(ctypes.get_errno(), "capset")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH, 0, 0)  # a compiler it runs reads too
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


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
        return lambda *args, **kwargs: self._server.ask(self._spec, name, args, kwargs)

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

    # -- loading ---------------------------------------------------------------------------------------------
    def load(self, load: dict) -> bool:
        from llm_inference_harness.engine.registry import load_elsewhere
        from llm_inference_harness.engine.runner import Target, _info, _load

        if "describe" in load:
            return self.describe(load["describe"])
        try:
            impl = load_elsewhere(_load(Target(load["technique"], name=load.get("name"), plugin=load.get("plugin"))))
        except BaseException as exc:  # noqa: BLE001 - a plugin that fails to load is a verdict, not a crash
            text = "".join(traceback.format_exception_only(exc)).strip()
            where = _where(exc, load.get("plugin"))
            failure = getattr(exc, "failure", None)  # a plugins.PluginLoadError's: whose fault, where
            self.send(("load_failed", f"{where}{text}"[-4000:], dataclasses.asdict(failure) if failure else None))
            return False
        info = _info(impl)
        self.objects[0] = impl.fn
        info["methods"], info["type_name"] = self.methods(impl.fn), type(impl.fn).__name__
        self.send(("loaded", self.encoder().encode(info)))
        return True

    def describe(self, module: str) -> bool:
        """Import another distribution's module and say what it registered (the harness lists it from that)."""
        import importlib

        from llm_inference_harness.engine.registry import REGISTRY
        from llm_inference_harness.engine.runner import _info

        before = set(REGISTRY)
        try:
            importlib.import_module(module.split(":")[0])
        except BaseException as exc:  # noqa: BLE001 - a module that fails to import is reported, not a crash
            self.send(("load_failed", f"{_where(exc, None)}{''.join(traceback.format_exception_only(exc)).strip()}"))
            return False
        infos = [_info(REGISTRY[key]) for key in sorted(set(REGISTRY) - before)]
        self.send(("described", self.encoder().encode(infos)))
        return False

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
        if op == "call":
            kind, payload = self.call(*rest, extras)
        elif op == "getattr":
            kind, payload = self.attribute(*rest)
        elif op == "many":
            kind, payload = "many", self.many(*rest)
        elif op == "paths":
            from llm_inference_harness.sampling.replay import run_paths

            kind, payload = "paths", run_paths(self, *rest)
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
        try:
            with _settings(options):
                out = guarded_call(fn, *args, timeout_s=options["timeout_s"], owns_torch_rng=options["owns_torch_rng"],
                                   compare_tensors=False, **kwargs)
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
        watched = collections.deque(maxlen=HANDED)
        for kept, items, where in self.handed:
            if sys.getrefcount(kept) <= 3:  # this record, the loop, the call: nothing else holds it to change it
                continue
            watched.append((kept, items, where))
            if len(kept) != len(items) or tuple(kept) != items:
                shown = repr(list(items))[:200], repr(kept)[:200]
                return (f"the list {shown[0]} handed to {where} became {shown[1]}: the implementation kept the "
                        "caller's list and changed it (inputs must be left unchanged; copy a list before keeping it)")
        self.handed = watched
        self.handed.extend((a, tuple(a), method) for a in args if type(a) is list and len(a) <= HANDED_ITEMS)
        return ""

    def many(self, handle: int, groups: list, timeout_s: float) -> list:
        """Several calls of one object's methods, in order, under one alarm.  A group is ``(method, "call", args,
        kwargs)``, or ``(method, "each", [a, b, ...])``: the method once per single argument; its answer is
        ``("atoms", [...])`` when every call returned a plain value, else ``("each", [(kind, payload), ...])``."""
        from llm_inference_harness.engine.guard import ContractViolation, guarded_call

        target, encode = self.objects[handle], self.encoder().encode

        def one(call, args, kwargs) -> tuple:
            try:
                return "ok", call(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - each call's own answer
                return "raised", exc

        def run() -> list:
            out = []
            for method, form, *rest in groups:
                call = getattr(target, method, None)
                if form == "call":
                    args, kwargs = self.decoder.decode(rest[0]), self.decoder.decode(rest[1])
                    kind, value = one(call, args, kwargs)
                    changed = self.hand_over(method, [*args, *kwargs.values()])
                    if changed:
                        kind, value = "violation", changed
                    payload = encode(value) if kind == "ok" else value if kind == "violation" else \
                        wire.encode_exception(value)
                    out.append(("each", [(kind, payload)]))
                    continue
                answers = [one(call, (self.decoder.decode(a),), {}) for a in rest[0]]
                if all(k == "ok" and wire.atom_or_atoms(v) for k, v in answers):
                    out.append(("atoms", [v for _, v in answers]))
                else:
                    out.append(("each", [(k, encode(v) if k == "ok" else wire.encode_exception(v))
                                         for k, v in answers]))
            return out

        try:
            return guarded_call(run, timeout_s=timeout_s, compare_tensors=False)
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
            self.models[key] = (obj, path, wire.module_state(obj))
        return obj

    def models_changed(self) -> str:
        """'' unless a model the judge sent has changed (its weights replaced or written in place)."""
        for obj, path, state in self.models.values():
            now = wire.module_state(obj)
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
        encoder = self.encoder()
        if spec.sink:
            self.sink_calls.append((spec.handle, method, encoder.encode(tuple(args))))
            return None
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


def _where(exc: BaseException, plugin: str | None) -> str:
    """'file:line: ' of a SyntaxError, else of the innermost frame in the plugin's file (or, for a module, outside
    the harness and the libraries)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}: "
    frames = traceback.extract_tb(exc.__traceback__)
    path = os.path.abspath(plugin.rsplit(":", 1)[0]) if plugin and plugin.rsplit(":", 1)[0].endswith(".py") else ""
    mine = [f for f in frames if os.path.abspath(f.filename) == path] or [
        f for f in frames if not any(part in f.filename for part in ("/harness/", "importlib", "site-packages"))]
    return f"{mine[-1].filename}:{mine[-1].lineno}: " if mine else ""
