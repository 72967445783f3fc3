"""What crosses the boundary between the judge and the implementation's process, and how.

Nothing is shared but copies.  A value sent across is one of three kinds:

* plain data -- None, bools, numbers, strings, bytes, tuples, lists, dicts and sets of plain data, torch dtypes
  and devices, tensors, numpy arrays, and instances of the harness's own dataclasses and named tuples -- copied;
* an object the judge hands over whole (a model, a seeded rng: `BY_VALUE`) -- pickled, one way only, judge to
  implementation;
* any other object -- a reference: it stays in the process that made it, and a call on it is a message to
  that process (`Ref`).  A reference's class may declare ``harness_sink = True`` (its methods return nothing,
  e.g. a KV storage the block manager writes through): the implementation's side records the calls and the
  judge replays them, in order, when the call that made them returns -- one message instead of one per write.

The judge reads what the implementation's process sends with an unpickler that resolves no global at all
(`loads_untrusted`): such a message can only be a tree of builtins, so reading it runs no code.  Tensors in it
are rebuilt from bytes as plain dense tensors of the named dtype (`decode`): no subclass, no view of anything the
implementation can still write.  Input tensors go the other way through a shared arena (`Arena`): the judge
copies each into shared memory, the implementation's process sees views of it, and after the call the judge
compares the arena with its own untouched copy -- an input mutation is seen by the judge itself, not reported.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import itertools
import mmap
import os
import pickle
import sys
from typing import Any

import numpy as np
import torch

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128)}
PLAIN_ATOMS = (type(None), bool, int, float, str, bytes)
_PLAIN = frozenset(PLAIN_ATOMS)


def atoms(values: Any) -> bool:
    """Every item of ``values`` a plain atom (exactly one of `PLAIN_ATOMS`, no subclass): one pass in C, ~2x a
    generator's speed (token ids, block tables, a batch's answers: ~10^5 a machine program)."""
    return _PLAIN.issuperset(map(type, values))


def atom_or_atoms(value: Any) -> bool:
    """A plain atom, or a list of them (a block table): what a batch of queries answers in one list."""
    return type(value) in _PLAIN or (type(value) is list and _PLAIN.issuperset(map(type, value)))


def atoms_or_lists(values: list) -> bool:
    """Every item an `atom_or_atoms`: all atoms checked in one pass first."""
    return _PLAIN.issuperset(map(type, values)) or all(map(atom_or_atoms, values))


def rows_of_atoms(rows: list) -> bool:
    """Every item of ``rows`` a tuple of plain atoms (no subclass): two passes in C (a worked example's ~10^5
    storage writes)."""
    return {tuple}.issuperset(map(type, rows)) and _PLAIN.issuperset(map(type, itertools.chain.from_iterable(rows)))


class Malformed(Exception):
    """A message from the implementation's process that is not a well-formed tree of plain values."""


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ARG002 - every global is refused
        raise Malformed(f"the message names a global ({module}.{name}); only plain values may cross")


def loads_untrusted(data: bytes) -> Any:
    """Unpickle bytes from the implementation's process: builtins only, never a class or a function."""
    try:
        return _NoGlobals(io.BytesIO(data)).load()
    except Malformed:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a forged stream makes the unpickler raise
        raise Malformed(f"unreadable message: {type(exc).__name__}: {exc}") from None


def dumps(tree: Any) -> bytes:
    return pickle.dumps(tree, protocol=5)


@dataclasses.dataclass(frozen=True)
class RefSpec:
    """A reference as it travels: who owns the object, its handle there, and its public methods."""

    owner: str  # "judge" | "impl"
    handle: int
    methods: tuple[str, ...]
    type_name: str
    sink: bool = False
    attrs: tuple = ()  # (name, value) of a judge object's plain public attributes (a model's vocab_size)


class Arena:
    """Shared memory (a memfd) the judge copies a call's input tensors into; the other side maps it.

    ``put`` reserves and fills a slot; ``reset`` starts the next call's inputs at the beginning.  It grows by
    replacement (a new memfd, sent before the call that needs it): views the other side still holds keep the
    old mapping alive there."""

    ALIGN = 64

    def __init__(self, size: int = 1 << 20) -> None:
        self.size, self.used = size, 0
        self.fd = os.memfd_create("harness-arena", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        self.generation = 0

    def reset(self) -> None:
        self.used = 0

    def reserve(self, nbytes: int) -> int:
        """The offset of ``nbytes`` free bytes, growing the arena (a new generation) when they do not fit."""
        start = -(-self.used // self.ALIGN) * self.ALIGN
        if start + nbytes > self.size:
            raise ArenaFull(start + nbytes)
        self.used = start + nbytes
        return start

    def grow(self, needed: int) -> None:
        size = self.size
        while size < needed:
            size *= 2
        os.close(self.fd)
        self.fd = os.memfd_create("harness-arena", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)  # the old map lives on while tensors view it
        self.size, self.used, self.generation = size, 0, self.generation + 1

    def view(self, offset: int, dtype: torch.dtype, count: int) -> torch.Tensor:
        return torch.frombuffer(self.map, dtype=dtype, count=count, offset=offset)


class ArenaFull(Exception):
    def __init__(self, needed: int) -> None:
        self.needed = needed


def span(t: torch.Tensor) -> tuple[int, int]:
    """(first storage element, element count) that a strided tensor reads: strides are never negative."""
    if t.numel() == 0:
        return t.storage_offset(), 0
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.storage_offset(), last + 1


def flat_span(t: torch.Tensor) -> torch.Tensor:
    """The storage elements a tensor reads, as a 1-d view (expanded and overlapping strides included)."""
    start, count = span(t)
    return t.as_strided((count,), (1,), start)


# --- encoding: what each side sends ----------------------------------------------------------------------------
class Encoder:
    """Turns values into trees of builtins.  ``refs(obj) -> RefSpec`` makes a reference of a non-plain object;
    ``arena`` (the judge's side only) carries input tensors; ``inputs`` collects (path, tensor, offset) of what
    went through the arena so the judge can compare after the call."""

    def __init__(self, refs, arena: Arena | None = None, by_value: tuple[type, ...] = (), sent: dict | None = None):
        """``sent``: the judge's record of the models already sent (`value_key`); one sent before is named, not
        sent again.  With it, a model that declares its tensors (``harness_tensors``: a `TableLM`) goes by value
        too, whatever ``by_value`` names."""
        self.refs, self.arena, self.by_value, self.sent = refs, arena, by_value, sent
        self.inputs: list[tuple[str, torch.Tensor, int]] = []

    def encode(self, value: Any, path: str = "input") -> Any:
        kind = type(value)
        if kind in PLAIN_ATOMS:
            return value
        if kind is complex:
            return ("c", value.real, value.imag)
        if isinstance(value, torch.Tensor):
            return self.tensor(value, path)
        if kind is tuple or kind is torch.Size:
            return ("t", tuple(self._item(v, path, i) for i, v in enumerate(value)))
        if kind is list:
            if atoms(value):  # token ids, block tables: one pass
                return ("L", value)
            return ("l", [self._item(v, path, i) for i, v in enumerate(value)])
        if kind is dict:
            return ("d", [(self.encode(k, path), self.encode(v, f"{k!s}" if path == "input" else f"{path}[{k!r}]"))
                          for k, v in value.items()])
        if kind in (set, frozenset):
            return ("s", [self.encode(v, path) for v in value])
        if kind is collections.OrderedDict:  # a state_dict: its items, as a dict
            return self.encode(dict(value), path)
        if issubclass(kind, tuple) and hasattr(kind, "_fields") and not _harness_record(kind):  # a named tuple
            return self.encode(tuple(value), path)
        if isinstance(value, torch.dtype):
            return ("dt", str(value).removeprefix("torch."))
        if isinstance(value, torch.device):
            return ("dev", str(value))
        if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
            return ("np", value.dtype.str, list(value.shape), np.ascontiguousarray(value).tobytes())
        if isinstance(value, np.generic):
            return self.encode(value.item(), path)
        if _harness_record(kind):
            fields = value._asdict() if isinstance(value, tuple) else {
                f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return ("D", f"{kind.__module__}:{kind.__qualname__}",
                    [(k, self.encode(v, f"{path}.{k}")) for k, v in fields.items()])
        if (self.by_value and isinstance(value, self.by_value)) or (
                self.sent is not None and hasattr(kind, "harness_tensors")):
            key = value_key(value)
            if key is not None and self.sent is not None and key in self.sent:
                self.sent.move_to_end(key)
                return ("P", key, None, path, [])
            forget = []
            if key is not None and self.sent is not None:
                self.sent[key] = value  # held: the key's id stays this object's
                while len(self.sent) > KEPT_MODELS:  # an earlier example's models: forgotten on both sides
                    forget.append(self.sent.popitem(last=False)[0])
            return ("P", key, pickle.dumps(value, protocol=5), path, forget)
        spec = self.refs(value)
        return ("R", spec.owner, spec.handle, spec.methods, spec.type_name, spec.sink,
                [(k, self.encode(v, f"{path}.{k}")) for k, v in spec.attrs])

    def _item(self, value: Any, path: str, i: int) -> Any:
        """Item ``i`` of a tuple or list at ``path``: an atom or a list of atoms (a call's token ids, ~10^4 a machine
        program) without formatting its path, which only a tensor or a model sent by value reports."""
        kind = type(value)
        if kind in PLAIN_ATOMS:
            return value
        if kind is list and atoms(value):
            return ("L", value)
        return self.encode(value, f"{path}[{i}]")

    def tensor(self, t: torch.Tensor, path: str) -> Any:
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise TypeError(f"{path}: tensors of dtype {t.dtype} cannot cross the boundary")
        t = t.detach()
        if t.layout != torch.strided:
            raise TypeError(f"{path}: a {t.layout} tensor cannot cross the boundary (dense tensors only)")
        if t.device.type == "meta":  # no data: shape, strides and dtype are all it has
            return ("M", dtype, list(t.shape), list(t.stride()))
        if self.arena is None:  # the implementation's side: a dense copy in the message
            dense = t.contiguous().cpu().reshape(-1)
            data = dense.view(torch.uint8).numpy().tobytes() if dense.numel() else b""
            return ("T", dtype, list(t.shape), data, str(t.device))
        flat = flat_span(t)
        nbytes = flat.numel() * t.element_size()
        offset = self.arena.reserve(nbytes)
        if nbytes:
            self.arena.view(offset, t.dtype, flat.numel()).copy_(flat)
        self.inputs.append((path, t, offset))
        return ("A", dtype, list(t.shape), list(t.stride()), offset, flat.numel(), str(t.device))


KEPT_MODELS = 8  # models sent by value that both sides keep (the latest used): a test uses one or two at a time


def value_key(value: Any) -> tuple | None:
    """What says a model is the one sent before, unchanged: its identity and every tensor's identity and version (an
    in-place change bumps a tensor's version).  None: send it every time (a seeded rng, whose state moves with every
    draw)."""
    if not isinstance(value, torch.nn.Module) and not hasattr(type(value), "harness_tensors"):
        return None
    return (id(value), *model_state(value))


def model_state(model: Any) -> tuple:
    """The same fingerprint, over there: a decoder that changes its model's weights changes it.  A module's is read
    from each submodule's own tables, not `state_dict()`, whose hooks and key building cost ~1 ms a call on a tiny
    model: taken at every call, it was most of a stateful decoder's time across the boundary.  Another model's are
    the tensors its class names in ``harness_tensors`` (a `TableLM`'s table)."""
    if not isinstance(model, torch.nn.Module):
        return tuple(_fingerprint(t) for t in _named_tensors(model).values())
    return tuple((id(t), t._version) for m in model.modules() for table in (m._parameters, m._buffers)
                 for t in table.values() if t is not None)


def changed_tensor_name(model: Any, before: tuple) -> str:
    """The name of a tensor of ``model`` whose fingerprint is not in ``before``."""
    known = set(before)
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)] if (
        isinstance(model, torch.nn.Module)) else list(_named_tensors(model).items())
    return next((name for name, t in named if _fingerprint(t) not in known), "its parameters")


def _named_tensors(model: Any) -> dict[str, Any]:
    return {name: getattr(model, name, None) for name in type(model).harness_tensors}


def _fingerprint(t: Any) -> tuple:
    """A tensor's identity and version; whatever replaced a model's tensor has a fingerprint too (another one)."""
    return id(t), getattr(t, "_version", None)


_PACKAGE = __name__.split(".")[0]  # the harness's top-level name: this module is <it>.engine.wire


def _ours(module: str) -> bool:
    """A module of the harness itself; implementations (impls/ too) are judged like any plugin."""
    return module.split(".")[0] == _PACKAGE and module.split(".")[1:2] != ["impls"]


def _harness_record(kind: type) -> bool:
    """The harness's value types travel as their fields: named tuples (a `Quantized`), frozen dataclasses, and the
    contracts' own dataclasses (a `Generation`).  Another dataclass holds state (an adapter's cache) and travels
    as a reference, like any object."""
    module = getattr(kind, "__module__", "") or ""
    if not _ours(module):
        return False
    if issubclass(kind, tuple) and hasattr(kind, "_fields"):
        return True
    frozen = dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen
    return frozen or (dataclasses.is_dataclass(kind) and module.startswith(f"{_PACKAGE}.contracts"))


def changed_inputs(encoder: Encoder) -> list[str]:
    """The paths of the input tensors whose arena copies differ from the judge's own (NaN equal to NaN)."""
    changed = []
    for path, t, offset in encoder.inputs:
        flat = flat_span(t)
        if flat.numel() == 0:
            continue
        seen = encoder.arena.view(offset, t.dtype, flat.numel())
        if not _same(flat.cpu(), seen):
            changed.append(path)
    return changed


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if torch.equal(a, b):
        return True
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))
    return False


# --- decoding -----------------------------------------------------------------------------------------------------
class Decoder:
    """Rebuilds values from trees.  ``trusted`` (the implementation's side reading the judge) accepts pickled
    objects and arena tensors; the judge's decoder accepts neither and checks every tree it is given."""

    def __init__(self, resolve_ref, *, trusted: bool, arena_map=None, values=None) -> None:
        """``values(key, pickled or None, path)``: the implementation's side keeps the models it was sent."""
        self.resolve_ref, self.trusted, self.arena_map, self.values = resolve_ref, trusted, arena_map, values

    def decode(self, tree: Any, depth: int = 0) -> Any:
        if depth > 200:
            raise Malformed("the message nests deeper than 200 levels")
        kind = type(tree)
        if kind in PLAIN_ATOMS:
            return tree
        if kind is not tuple or not tree or type(tree[0]) is not str:
            raise Malformed(f"an untagged {kind.__name__} in the message")
        tag, rest = tree[0], tree[1:]
        try:
            return self._tagged(tag, rest, depth)
        except Malformed:
            raise
        except Exception as exc:  # noqa: BLE001 - a forged tree: wrong arities, types, sizes
            raise Malformed(f"a malformed {tag!r} entry: {type(exc).__name__}: {exc}") from None

    def _tagged(self, tag: str, rest: tuple, depth: int) -> Any:
        d = depth + 1
        if tag == "t":
            return tuple(self.decode(v, d) for v in _seq(rest[0], tuple))
        if tag == "l":
            return [self.decode(v, d) for v in _seq(rest[0], list)]
        if tag == "L":
            items = _seq(rest[0], list)
            if not atoms(items):
                raise Malformed("a list of atoms holds something else")
            return list(items)
        if tag == "d":
            return {self.decode(k, d): self.decode(v, d) for k, v in _seq(rest[0], list)}
        if tag == "s":
            return {self.decode(v, d) for v in _seq(rest[0], list)}
        if tag == "c":
            return complex(_num(rest[0]), _num(rest[1]))
        if tag == "dt":
            return DTYPES[rest[0]]
        if tag == "dev":
            return torch.device(_str(rest[0]))
        if tag == "T":
            return dense_tensor(*rest)
        if tag == "M":
            return torch.empty_strided(_shape(rest[1]), _shape(rest[2]), dtype=DTYPES[rest[0]], device="meta")
        if tag == "np":
            dtype, shape, data = np.dtype(_str(rest[0])), _shape(rest[1]), rest[2]
            if dtype.kind not in "biufc" or dtype.hasobject or type(data) is not bytes:
                raise Malformed("a numpy array of an object dtype")
            return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
        if tag == "D":
            return self.record(_str(rest[0]), _seq(rest[1], list), d)
        if tag == "R":
            attrs = tuple((_str(k), self.decode(v, d)) for k, v in _seq(rest[5], list)) if self.trusted else ()
            return self.resolve_ref(RefSpec(_str(rest[0]), int(rest[1]), tuple(map(_str, rest[2])), _str(rest[3]),
                                            bool(rest[4]), attrs))
        if tag == "A" and self.trusted:
            dtype, shape, stride, offset, count, device = rest
            base = torch.frombuffer(self.arena_map(), dtype=DTYPES[dtype], count=count, offset=offset) if count \
                else torch.empty(0, dtype=DTYPES[dtype])
            t = base.as_strided(shape, stride, base.storage_offset()) if count else torch.empty_strided(
                shape, stride, dtype=DTYPES[dtype])
            return t if device == "cpu" else t.to(device)
        if tag == "P" and self.trusted:
            return self.values(*rest)
        raise Malformed(f"an unknown tag {tag!r}")

    def record(self, where: str, fields: list, depth: int) -> Any:
        """A harness dataclass or named tuple, rebuilt only if its module is already loaded here (a message never
        makes this process import anything); otherwise a dict of its fields."""
        module, _, qualname = where.partition(":")
        values = {_str(k): self.decode(v, depth) for k, v in fields}
        cls = sys.modules.get(module) if _ours(module) else None
        for part in qualname.split(".") if cls is not None else ():
            cls = getattr(cls, part, None)
        if isinstance(cls, type) and _harness_record(cls):
            return cls(**values)
        return values


def dense_tensor(dtype: Any, shape: Any, data: Any, device: Any) -> torch.Tensor:
    """A plain tensor owned by this process, from a dtype name, a shape and the bytes of its elements."""
    dt = DTYPES[_str(dtype)]
    shape = _shape(shape)
    if type(data) is not bytes:
        raise Malformed("tensor data must be bytes")
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    itemsize = torch.empty((), dtype=dt).element_size()
    if len(data) != numel * itemsize:
        raise Malformed(f"a tensor of shape {shape} and dtype {dtype} needs {numel * itemsize} bytes, got {len(data)}")
    t = torch.frombuffer(bytearray(data), dtype=dt) if numel else torch.empty(0, dtype=dt)
    t = t.reshape(shape)
    device = torch.device(_str(device))
    return t if device.type == "cpu" else t.to(device)


def _seq(value: Any, kind: type) -> Any:
    if type(value) is not kind:
        raise Malformed(f"expected a {kind.__name__}, got {type(value).__name__}")
    return value


def _str(value: Any) -> str:
    if type(value) is not str:
        raise Malformed(f"expected a string, got {type(value).__name__}")
    return value


def _num(value: Any) -> float:
    if type(value) not in (int, float):
        raise Malformed(f"expected a number, got {type(value).__name__}")
    return value


def _shape(value: Any) -> list[int]:
    if type(value) is not list or not all(type(n) is int and n >= 0 for n in value):
        raise Malformed(f"a shape must be a list of non-negative ints, got {value!r}"[:200])
    return value


# --- exceptions -------------------------------------------------------------------------------------------------
BUILTIN_ERRORS = {e.__name__: e for e in (
    ValueError, TypeError, KeyError, IndexError, RuntimeError, NotImplementedError, AssertionError, ZeroDivisionError,
    OverflowError, MemoryError, AttributeError, LookupError, ArithmeticError, OSError, RecursionError, SystemExit,
    StopIteration, ImportError, ModuleNotFoundError, NameError, UnboundLocalError, FloatingPointError,
    UnicodeError, BufferError, EOFError, Exception)}


def encode_exception(exc: BaseException) -> tuple:
    """(class name, the builtin or harness class it descends from, its text) of an exception."""
    base = next((c for c in type(exc).__mro__ if c.__name__ in BUILTIN_ERRORS and c.__module__ == "builtins"),
                Exception)
    harness_class = next((f"{c.__module__}:{c.__qualname__}" for c in type(exc).__mro__
                          if _ours(c.__module__ or "")), "")
    text = str(exc.args[0]) if isinstance(exc, KeyError) and len(exc.args) == 1 else str(exc)
    return ("E", type(exc).__name__, base.__name__, harness_class, text[:20000])


_MADE: dict[tuple[str, type], type] = {}


def decode_exception(tree: Any) -> BaseException:
    """An exception the judge can raise and inspect: the harness's own class when the implementation's process
    raised one (an `OutOfBlocks`), else its builtin base, or a subclass of that base bearing its name."""
    try:
        tag, name, base_name, harness_class, text = tree
        if tag != "E":
            raise ValueError(tag)
        name, base_name, harness_class, text = _str(name), _str(base_name), _str(harness_class), _str(text)
    except Exception as exc:  # noqa: BLE001
        raise Malformed(f"a malformed exception: {exc}") from None
    base = BUILTIN_ERRORS.get(base_name, Exception)
    if harness_class:
        module, _, qualname = harness_class.partition(":")
        cls = sys.modules.get(module)
        for part in qualname.split(".") if cls is not None else ():
            cls = getattr(cls, part, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            base = cls
    if name != base.__name__ and name.isidentifier():
        base = _MADE.setdefault((name, base), type(name, (base,), {"__module__": "plugin"}))
    try:
        return base(text)
    except Exception:  # noqa: BLE001 - a harness exception whose constructor takes other arguments
        exc = BUILTIN_ERRORS.get(base_name, Exception)(text)
        return exc
