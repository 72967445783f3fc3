"""Calling untrusted implementations: time limit, input-mutation check, output checks.

Every property calls implementations through `guarded_call`, so a plugin that hangs, raises,
mutates its inputs or returns NaN / the wrong shape gets a precise verdict instead of taking
the run down.  A hang poisons the implementation: later calls fail at once, so Hypothesis can
still shrink the failing example without waiting out the limit every time.
"""

from __future__ import annotations

import _signal
import contextlib
import copy
import ctypes
import dataclasses
import random
import re
import signal
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import numpy as np
import torch

from llm_inference_harness.engine import isolation
from llm_inference_harness.engine.capabilities import Caps

DEFAULT_TIMEOUT_S = Caps.call_limit_s
_hung: dict[int, str] = {}  # id(fn) -> first hang message


class ContractViolation(AssertionError):
    """The implementation broke its contract (wrong shape/dtype, NaN, mutation, hang...)."""


class BoundaryFailure(ContractViolation):
    """The implementation's process hung, died or sent what the judge cannot read: reported as it is, never as
    something a judge-side helper raised."""

    def __init__(self, message: str, *, hung: bool = False) -> None:
        super().__init__(message)
        self.hung = hung


class Crashed(BoundaryFailure):
    """The implementation's process died, or sent something the judge cannot read."""


class Hung(BoundaryFailure):
    """No reply within the call's limit: the implementation's process was killed."""

    def __init__(self, message: str) -> None:
        super().__init__(message, hung=True)


class Remote:
    """An object living in the implementation's process (started by harness/engine/boundary.py): calling it, or
    one of its methods, is a message, through this guard like any call."""

    __slots__ = ("process", "handle", "methods", "type_name", "__weakref__")

    def __init__(self, process: Any, handle: int, methods: tuple[str, ...], type_name: str) -> None:
        self.process, self.handle, self.methods, self.type_name = process, handle, methods, type_name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return call_unguarded(self, "__call__", args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self.methods:
            return RemoteMethod(self, name)
        return self.process.getattr(self.handle, name, DEFAULT_TIMEOUT_S)

    def __repr__(self) -> str:
        return f"<{self.type_name} in the implementation's process>"

    def __del__(self) -> None:
        if self.handle:  # handle 0, the implementation itself, lives as long as its process
            self.process.released.append(self.handle)


class RemoteMethod:
    """A bound method of a `Remote` object."""

    __slots__ = ("owner", "name")

    def __init__(self, owner: Remote, name: str) -> None:
        self.owner, self.name = owner, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return call_unguarded(self.owner, self.name, args, kwargs)

    @property
    def __name__(self) -> str:
        return self.name


def names_argument(message: str, *args: str) -> bool:
    """Whether an error message names one of ``args`` as a word ("q must be 4-d"), not as a letter inside
    another word (the "v" of "invalid shapes" names nothing)."""
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(a)}(?![A-Za-z0-9_])", message) for a in args)


def guarded_call(
    fn: Callable[..., Any], *args: Any, timeout_s: float = DEFAULT_TIMEOUT_S, arg_names: tuple[str, ...] = (),
    hang_owner: Any = None, watch: dict[str, Any] | None = None, owns_torch_rng: bool = False,
    compare_tensors: bool = True, known_state: list | None = None, **kwargs: Any,
) -> Any:
    """Call ``fn(*args, **kwargs)``; check it returned in time and left its inputs and the global state alone.

    ``arg_names`` names the positional arguments in messages ("mutated its input q").  A hang is recorded
    against ``hang_owner`` (default: fn, or a bound method's function, shared by every instance) and every
    later call for that owner fails at once: pass the implementation's ``impl.fn`` when ``fn`` is a helper
    that drives it, so the hang is charged to the implementation, not to the helper.  ``watch`` names
    objects the call must leave alone without receiving them (a model a stateful decoder holds).  Global
    state (default dtype and device, grad mode, thread count, RNG states) must be as it was after the call;
    ``owns_torch_rng``: the contract hands torch's global RNG to the call (a sampler declaring rng="own").
    ``fn`` in the implementation's process (a `Remote` proxy) is called there, under this guard, and its inputs
    are compared by the judge (harness/engine/boundary.py); ``compare_tensors=False`` leaves input tensors to
    that comparison (the implementation's process, whose tensors are views of the judge's arena).  ``known_state``,
    a one-item list: the global state after the caller's last guarded call, taken as this call's state before
    when it was read with the same ``owns_torch_rng`` (nothing ran in between: the call server's loop), and left
    there as this call's state after (a change made between two calls is charged to the second).
    """
    key = id(hang_owner if hang_owner is not None else getattr(fn, "__func__", fn))
    if key in _hung:
        raise ContractViolation(_hung[key])
    if _is_remote(fn):
        return _remote_call(fn, args, kwargs, key, timeout_s=timeout_s, arg_names=arg_names,
                            owns_torch_rng=owns_torch_rng, guarded=True)
    if is_remote(hang_owner):  # a judge-side helper driving an implementation in its own process: each call is
        return _helper_call(fn, args, kwargs, key, timeout_s)  # guarded over there; here only the time limit
    if args or kwargs or watch:
        named = {**dict(zip(arg_names, args, strict=False)), **{f"argument {i}": a for i, a in enumerate(args)
                                                                 if i >= len(arg_names)}, **kwargs, **(watch or {})}
        found = list(_inputs(named))  # one walk: a tensor mutated in place, a list or a config replaced, all show
    else:  # a batch of calls (the call server's `many`, a state machine's step): no inputs of its own
        found = []
    before = [(path, t.clone()) for path, t in _tensors(found)] if compare_tensors else []
    lists = [(path, seq, list(seq)) for path, seq in found if isinstance(seq, list)]  # a prompt kept by reference
    configs = list(_configs(found))
    known = known_state[0] if known_state else None
    state = known[1] if known is not None and known[0] == owns_torch_rng else global_state(owns_torch_rng)
    box = _timed(fn, args, kwargs, key, timeout_s)
    after = global_state(owns_torch_rng)
    if known_state is not None:
        known_state[0] = (owns_torch_rng, after)
    if "exc" in box:
        _raise(box["exc"], key)
    if after != state:  # one comparison of two tuples of atoms and bytes; which setting changed only when one did
        changed = changed_state(_named(state), _named(after))
        raise ContractViolation(f"changed global state: {changed} (a call must leave the process as it found it)")
    for (path, old), (_, new) in zip(before, _tensors(found) if compare_tensors else (), strict=True):
        if not _same(old, new):
            raise ContractViolation(f"mutated its input {path} (inputs must be left unchanged)")
    for path, seq, old in lists:
        if len(seq) != len(old) or not all(a is b or (_plain(a) and a == b) for a, b in zip(seq, old, strict=True)):
            raise ContractViolation(f"mutated its input {path}: {_shown(old)} became {_shown(seq)} "
                                    "(inputs must be left unchanged; copy a list before extending it)")
    for path, module, attr, old in configs:
        if getattr(module, attr, None) != old:
            raise ContractViolation(f"changed its input {path} (inputs must be left unchanged; a model's "
                                    "configuration too)")
    return box["out"]


def _helper_call(fn: Callable[..., Any], args: tuple, kwargs: dict, key: int, timeout_s: float) -> Any:
    """A judge-side helper whose calls go to the implementation's process, under the per-call limit only: the
    implementation's global state and inputs are not this process's (each call is compared over there)."""
    box = _timed(fn, args, kwargs, key, timeout_s)
    if "exc" in box:
        _raise(box["exc"], key)
    return box["out"]


def _timed(fn: Callable[..., Any], args: tuple, kwargs: dict, key: int, timeout_s: float) -> dict:
    """``fn(*args, **kwargs)`` under the per-call limit: {"out": ...} or {"exc": ...}; a hang is remembered for
    ``key`` (the implementation is not called again) and raised."""
    isolation.set_deadline(timeout_s)
    try:
        box = (_alarmed if _alarm_free() else _threaded)(fn, args, kwargs, timeout_s)
    finally:
        isolation.set_deadline(None)
    if box is None:
        _hung[key] = f"hung: no result within the per-call limit of {timeout_s:g} s"
        raise ContractViolation(_hung[key])
    return box


def _raise(exc: BaseException, key: int) -> NoReturn:
    """What a call raised, as its verdict: a failure across the boundary (inside a judge-side helper) as it came,
    a hang there remembered for ``key``; anything else a ContractViolation naming it."""
    if isinstance(exc, BoundaryFailure):
        if exc.hung:
            _hung[key] = str(exc)
        raise exc
    raise ContractViolation(_raised(exc)) from exc


def is_remote(obj: Any) -> bool:
    """Whether ``obj`` lives in the implementation's process (harness/engine/boundary.py)."""
    return isinstance(obj, Remote)


def _is_remote(fn: Any) -> bool:
    return isinstance(fn, Remote | RemoteMethod)


def _remote_call(fn: Any, args: tuple, kwargs: dict, key: int, *, timeout_s: float, arg_names: tuple[str, ...],
                 owns_torch_rng: bool, guarded: bool, paths: list | None = None) -> Any:
    """A call in the implementation's process.  ``guarded``: what the call raised becomes a ContractViolation
    caused by it, as in-process; otherwise it is raised as it is (a direct call, e.g. a factory or a method of
    an untimed manager)."""
    owner, method = (fn, "__call__") if isinstance(fn, Remote) else (fn.owner, fn.name)
    try:
        reply = owner.process.call(owner.handle, method, args, kwargs, timeout_s=timeout_s, arg_names=arg_names,
                                   owns_torch_rng=owns_torch_rng, paths=paths)
    except Hung as exc:
        _hung[key] = (f"hung: no result within the per-call limit of {timeout_s:g} s (it caught the alarm or never "
                      "returned to Python); its process group was killed")
        raise BoundaryFailure(_hung[key], hung=True) from exc
    except Crashed as exc:
        raise BoundaryFailure(str(exc)) from None
    if reply.kind == "raised":
        if not guarded:
            raise reply.error
        raise ContractViolation(_raised(reply.error)) from reply.error
    if reply.kind == "violation":
        if reply.payload.startswith("hung:"):
            _hung[key] = reply.payload
            owner.process.kill()
            owner.process.dead = reply.payload
            raise BoundaryFailure(reply.payload, hung=True)
        raise ContractViolation(reply.payload)
    if reply.mutated:
        raise ContractViolation(f"mutated its input {reply.mutated[0]} (inputs must be left unchanged)")
    return reply.value


def call_unguarded(owner: Any, method: str, args: tuple, kwargs: dict) -> Any:
    """A direct call of an object in the implementation's process (no guard around it on the judge's side): the
    implementation's own per-call limit, what it raises raised here."""
    fn = owner if method == "__call__" else RemoteMethod(owner, method)
    key = id(owner.process.impl_fn) if owner.process.impl_fn is not None else id(owner)
    if key in _hung:
        raise ContractViolation(_hung[key])
    return _remote_call(fn, args, kwargs, key, timeout_s=owner.process.call_limit_s, arg_names=(),
                        owns_torch_rng=False, guarded=False)


def replayed_calls(fn: Any, args: tuple, paths: list[list[int]], *, timeout_s: float) -> list:
    """``fn(*args, rng=ReplayRng(path))`` (harness/sampling/replay.py) for each path, in the implementation's process
    (``fn`` a `Remote` or one of its methods), one message and one guard over there for all of them: the runs'
    reports as it sent them, ``("run", output, depth, choices)`` or ``("raised", exception)``, up to the first that
    raised.  As a direct call: the implementation's own per-call limit applies to the batch."""
    owner = fn if isinstance(fn, Remote) else fn.owner
    key = id(owner.process.impl_fn) if owner.process.impl_fn is not None else id(owner)
    if key in _hung:
        raise ContractViolation(_hung[key])
    return _remote_call(fn, args, {}, key, timeout_s=timeout_s, arg_names=(), owns_torch_rng=False, guarded=False,
                        paths=paths)


class _Expired(BaseException):
    """Raised inside a call by the alarm; a BaseException, so an implementation's `except Exception` does not
    swallow it."""


def _alarm_free() -> bool:
    """The interval timer is ours to use: the main thread of a Unix process, no alarm already running."""
    return (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
            and signal.getitimer(signal.ITIMER_REAL)[0] == 0)


def _alarmed(fn: Callable[..., Any], args: tuple, kwargs: dict, timeout_s: float) -> dict[str, Any] | None:
    """Run ``fn`` here, interrupted by SIGALRM after ``timeout_s``: no thread handoff, which costs ~0.15 ms
    a call on a 2-core VM (a block-manager state machine makes ~10^5 calls).  A hang in C code that never
    returns to Python is left to the per-implementation process limit, as with a thread."""

    previous = _signal.signal(_SIGALRM, _expire)  # the C functions: signal.signal's enum conversions cost ~4 us
    _signal.setitimer(_ITIMER_REAL, timeout_s)
    try:
        return {"out": fn(*args, **kwargs)}
    except _Expired:
        return None
    except (Exception, SystemExit) as exc:  # reported to the caller; a KeyboardInterrupt stops the run
        return {"exc": exc}
    finally:
        _signal.setitimer(_ITIMER_REAL, 0)
        _signal.signal(_SIGALRM, previous)


def _expire(_signum: int, _frame: Any) -> None:
    raise _Expired


_SIGALRM, _ITIMER_REAL = int(getattr(signal, "SIGALRM", 14)), int(getattr(signal, "ITIMER_REAL", 0))


def _threaded(fn: Callable[..., Any], args: tuple, kwargs: dict, timeout_s: float) -> dict[str, Any] | None:
    """Off the main thread (no SIGALRM there): run ``fn`` in a daemon thread and wait ``timeout_s``; a hung
    call leaves its thread behind (and the implementation poisoned)."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller (this thread cannot stop the run)
            box["exc"] = exc

    worker = threading.Thread(target=work, daemon=True, name=f"guarded:{getattr(fn, '__name__', fn)}")
    worker.start()
    worker.join(timeout_s)
    return None if worker.is_alive() else box


def _raised(exc: BaseException) -> str:
    """What a failed call raised; an allocation refused by the child's address-space cap says so."""
    text = f"{type(exc).__name__}: {exc}"
    limit = isolation.memory_limit()
    if limit and (isinstance(exc, MemoryError) or "can't allocate memory" in str(exc)):
        return f"exceeded the memory limit of {limit / 2**30:g} GiB ({text[:300]})"
    return f"raised {text}"


STATE_NAMES = ("torch default dtype", "torch default device", "grad mode", "torch intra-op threads",
               "deterministic algorithms", "float32 matmul precision", "numpy global RNG", "python random RNG",
               "torch global RNG")


def global_state(owns_torch_rng: bool = False) -> tuple:
    """Process-wide settings and RNG states a call could change behind its caller's back, in the order of
    `STATE_NAMES` (the torch RNG left out when the call owns it): atoms, strings and bytes, so that two are compared
    with one ``==`` (a guarded call compares two, ~10^4 a state machine); `changed_state` names what changed."""
    state = (torch.get_default_dtype(), _default_device(), torch.is_grad_enabled(), torch.get_num_threads(),
             torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision(), _numpy_rng(),
             _python_rng())
    return state if owns_torch_rng else (*state, _torch_rng())


def _named(state: tuple) -> dict[str, Any]:
    return dict(zip(STATE_NAMES, state, strict=False))


def _torch_rng() -> bytes:
    """torch's default CPU generator's state, its bytes (torch.equal of two state tensors costs ~5 us; comparing
    their bytes, ~0.1 us)."""
    state = torch.default_generator.get_state()  # a new contiguous uint8 tensor: what torch.get_rng_state() returns
    return ctypes.string_at(state.data_ptr(), state.numel())


def _default_device() -> str:
    """str(torch.get_default_device()), without its ~4 us where no torch function mode is active and no default
    device was set (then it is the CPU, as torch/__init__.py's get_default_device reads it)."""
    if torch._C._len_torch_function_stack() == 0 and getattr(
            getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None) is None:
        return "cpu"
    return str(torch.get_default_device())


_MT19937_STATE_BYTES = 624 * 4 + 4  # numpy's mt19937_state: uint32_t key[624]; int pos


def _numpy_rng() -> tuple:
    """numpy's global generator: its MT19937 key and position read in place (np.random.get_state() copies the
    key word by word, ~50 us, twice per guarded call).  Every draw, seed() or set_state() moves them, except a
    normal served from the Box-Muller spare that an odd draw before it left, and that draw moved them."""
    bitgen = np.random.mtrand._rand._bit_generator
    if type(bitgen) is not np.random.MT19937:  # np.random.set_bit_generator(...) replaced it: compare in full
        return id(bitgen), repr(bitgen.state)
    return id(bitgen), ctypes.string_at(bitgen.ctypes.state_address, _MT19937_STATE_BYTES)


def _python_rng() -> Any:
    """Python's global generator: its Mersenne Twister key and position read in place (random.getstate() builds a
    625-int tuple, ~10 us, twice per guarded call), and the Gaussian it keeps; in full where that layout was not
    found (`_RANDOM_STATE_AT`)."""
    inst = random._inst
    if _RANDOM_STATE_AT is None or type(inst) is not random.Random:
        return random.getstate()
    return id(inst), ctypes.string_at(id(inst) + _RANDOM_STATE_AT, _MT19937_STATE_BYTES), inst.gauss_next


def _random_state_at() -> int | None:
    """Where CPython's random.Random keeps ``int index; uint32_t state[624]`` (right after the object header), if
    reading it there agrees with getstate() on a generator seeded here; None elsewhere (another interpreter)."""
    probe = random.Random(20240607)
    probe.random()
    key = probe.getstate()[1]
    expected = struct.pack("i624I", key[624], *key[:624])
    for offset in (16, 24, 32):
        with contextlib.suppress(Exception):
            if ctypes.string_at(id(probe) + offset, len(expected)) == expected:
                return offset
    return None


_RANDOM_STATE_AT = _random_state_at()


def changed_state(before: dict[str, Any], after: dict[str, Any]) -> str:
    """'' if nothing changed, else which settings changed and how."""
    changes = []
    for key, old in before.items():
        new = after[key]
        same = torch.equal(old, new) if isinstance(old, torch.Tensor) else old == new
        if not same:
            shown = "" if isinstance(old, torch.Tensor | tuple | bytes) else f" {old!r} -> {new!r}"
            changes.append(f"{key}{shown}")
    return ", ".join(changes)


def call_limit(impl: Any) -> float:
    """An implementation's per-call limit: the ``call_limit_s`` it declares (a JIT kernel compiles on the
    first call of each specialization, seconds when many processes compile at once) or the default."""
    return impl.caps.call_limit_s


def assert_rejected(impl: Any, case: str, *args: Any, names: tuple[str, ...], method: Callable[..., Any] | None = None,
                    **kwargs: Any) -> None:
    """``impl`` (or a ``method`` of an object it made) called with these arguments must raise ValueError/TypeError
    whose message names one of ``names``, the argument at fault; a result, another error or a hang fails,
    naming ``case``."""
    try:
        guarded_call(method or impl.fn, *args, timeout_s=call_limit(impl), hang_owner=impl.fn, **kwargs)
    except ContractViolation as exc:
        cause = exc.__cause__
        assert isinstance(cause, ValueError | TypeError), f"{impl.name} ({case}): {exc}, not a ValueError/TypeError"
        assert names_argument(str(cause), *names), f"{impl.name} ({case}): '{cause}' names none of {', '.join(names)}"
    else:
        raise AssertionError(f"{impl.name} accepted bad input ({case}) and returned a result instead of raising")


def hang_message(fn: Callable[..., Any]) -> str | None:
    """The recorded hang of ``fn``, if it ever exceeded the per-call limit."""
    return _hung.get(id(fn))


def check_tensor(
    value: Any,
    *,
    what: str,
    shape: tuple[int, ...] | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    finite: bool = True,
) -> torch.Tensor:
    """Raise ContractViolation unless ``value`` is a tensor of the promised shape/dtype/device, finite."""
    if not isinstance(value, torch.Tensor):
        raise ContractViolation(f"{what}: returned {type(value).__name__}, expected a torch.Tensor")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise ContractViolation(f"{what}: returned shape {tuple(value.shape)}, expected {tuple(shape)}")
    if dtype is not None and value.dtype != dtype:
        raise ContractViolation(f"{what}: returned dtype {value.dtype}, expected {dtype}")
    if device is not None and value.device.type != torch.device(device).type:
        raise ContractViolation(f"{what}: returned a tensor on {value.device}, expected {device}")
    if finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
        bad = (~torch.isfinite(value)).nonzero()[0].tolist()
        raise ContractViolation(f"{what}: returned a non-finite value ({value[tuple(bad)].item()}) at {bad}")
    return value


def _inputs(obj: Any, path: str = "input") -> Iterator[tuple[str, Any]]:
    """Every object among the inputs with its path: top-level arguments by name, container items by index."""
    yield path, obj
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _inputs(value, f"{key!s}")
    elif isinstance(obj, list | tuple):
        for i, value in enumerate(obj):
            yield from _inputs(value, f"{path}[{i}]")


def _tensors(found: list[tuple[str, Any]]) -> Iterator[tuple[str, torch.Tensor]]:
    for path, obj in found:
        if isinstance(obj, torch.Tensor):
            yield path, obj
        elif isinstance(obj, torch.nn.Module):  # its weights and buffers
            for name, t in obj.state_dict(keep_vars=True).items():
                yield f"{path}.{name}", t.detach()
        elif hasattr(type(obj), "harness_tensors"):  # another model's tensors (a `TableLM`'s table)
            for name in type(obj).harness_tensors:
                yield f"{path}.{name}", getattr(obj, name)


def _configs(found: list[tuple[str, Any]]) -> Iterator[tuple[str, torch.nn.Module, str, Any]]:
    """Every dataclass a module among the inputs holds (a model's config: its rotary base, its sizes), as
    it was before the call: replacing it changes what the module computes without touching a weight."""
    for path, obj in found:
        if isinstance(obj, torch.nn.Module):
            for prefix, module in obj.named_modules(prefix=path):
                for attr, value in vars(module).items():
                    if dataclasses.is_dataclass(value) and not isinstance(value, type):
                        yield f"{prefix}.{attr}", module, attr, value if _immutable(value) else copy.deepcopy(value)


def _immutable(value: Any) -> bool:
    """A frozen dataclass of numbers, strings and tuples of them: changing it means replacing it, which the
    comparison with the object itself shows, so it needs no deep copy (a model's config is copied every call)."""
    if not type(value).__dataclass_params__.frozen:
        return False
    atoms = (int, float, str, bool, type(None))
    return all(isinstance(v, atoms) or (isinstance(v, tuple) and all(isinstance(x, atoms) for x in v))
               for v in (getattr(value, f.name) for f in dataclasses.fields(value)))


def _plain(value: Any) -> bool:
    """A value compared by ==: a number or a string (a tensor element is compared by identity, its contents
    by the tensor check; an inner list by its own entry)."""
    return isinstance(value, int | float | str | bool | None)


def _shown(seq: list) -> str:
    return repr(seq) if len(seq) <= 12 else f"{repr(seq[:12])[:-1]}, ... ({len(seq)} items)]"


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):  # the common case in one kernel; only a tensor holding NaN needs the comparison below
        return True
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))
    return False
