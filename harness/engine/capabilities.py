"""Typed capabilities: what an implementation declares about itself, one frozen dataclass per technique.

Each contract subclasses `Caps` with its own fields, each made by `cap(default, meaning)`; `register` and
`declare` turn the ``caps={...}`` mapping they are given into an instance with `build`, which rejects an
unknown key (listing the valid ones) or a value of the wrong type, so a typo is an error, never a silently
undeclared capability that turns into a skip.  ``harness list TECHNIQUE --caps`` prints the table.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from llm_inference_harness.engine.registry import Impl


def cap(default: Any, meaning: str) -> Any:
    """A capability field: its default (what an implementation that says nothing gets) and a one-line meaning."""
    return dataclasses.field(default=default, metadata={"meaning": meaning})


@dataclass(frozen=True)
class Caps:
    """Capabilities every technique's implementations may declare."""

    call_limit_s: float = cap(20.0, "per-call time limit in seconds; a JIT kernel, which compiles on the first call "
                                    "of each specialization, declares a longer one")

    @classmethod
    def table(cls) -> list[tuple[str, str, str, str]]:
        """(name, type, default, meaning) of every field, in declaration order."""
        hints = typing.get_type_hints(cls)
        return [(f.name, _type_name(hints[f.name]), repr(f.default), f.metadata.get("meaning", ""))
                for f in dataclasses.fields(cls)]

    def declared(self) -> dict[str, Any]:
        """The fields that differ from their default: what the implementation actually declared."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != f.default}


@dataclass(frozen=True)
class BatchedCaps(Caps):
    """Capabilities of techniques that compute one output per request of a batch."""

    batch_invariant: bool = cap(False, "each row's output is bit-identical whatever it is batched with (alone, in "
                                       "any batch size, composition or order)")
    deterministic: bool = cap(False, "the same inputs give the same bits, call after call and at any thread count")


def build(schema: type[Caps], declared: Mapping[str, Any] | Caps, *, who: str) -> Caps:
    """``schema(**declared)`` after checking every key and value; TypeError naming the key otherwise."""
    if isinstance(declared, schema):
        return declared
    if not isinstance(declared, Mapping):
        raise TypeError(f"{who}: caps must be a dict of capability name -> value, got {type(declared).__name__}")
    hints = typing.get_type_hints(schema)
    valid = [f.name for f in dataclasses.fields(schema)]
    for key, value in declared.items():
        if key not in hints:
            raise TypeError(f"{who}: unknown capability {key!r}; the valid ones are {', '.join(valid)} "
                            f"(harness list --caps shows their meaning)")
        if not _conforms(value, hints[key]):
            raise TypeError(f"{who}: capability {key!r} must be {_type_name(hints[key])}, got {value!r}")
    return schema(**declared)


def _conforms(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(_conforms(v, a) for v, a in zip(value, args, strict=True))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is tuple:
        return f"tuple[{', '.join('...' if a is Ellipsis else _type_name(a) for a in args)}]"
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))


# --- when a property applies: decided from what an implementation declares ---------------------------------------
Predicate = Callable[["Impl"], "str | None"]  # returns a skip reason, or None when the property applies


def applies(predicate: Predicate) -> Callable[[Callable], Callable]:
    """Declare when a property applies: ``@applies(lambda impl: None if impl.exact else "approximate")``."""

    def mark(fn: Callable) -> Callable:
        fn.harness_applies = [*getattr(fn, "harness_applies", []), predicate]
        return fn

    return mark


def needs_cap(cap: str, why: str) -> Callable[[Callable], Callable]:
    """Applies only to implementations declaring the boolean capability ``cap``."""

    def declared(impl: Impl) -> str | None:
        if not hasattr(impl.caps, cap):
            raise AttributeError(f"needs_cap: {cap!r} is not a capability of {impl.technique} "
                                 f"({type(impl.caps).__name__})")
        return None if getattr(impl.caps, cap) else f"{impl.name} does not declare {cap!r} ({why})"

    return applies(declared)


def needs_dtype(*dtypes: str) -> Callable[[Callable], Callable]:
    return applies(lambda impl: None if set(dtypes) & set(impl.dtypes) else f"declares none of {dtypes}")
