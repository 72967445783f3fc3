"""The registry: one dict of frozen records, one decorator, one entry-point group.

Every implementation of every technique -- ours, mutants, and third-party plugins -- is an
`Impl` record in `REGISTRY`, keyed by ``(technique, name)``.  Capabilities are declared here,
never discovered by crashing: the property runner reads them to decide what applies.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

ENTRY_POINT_GROUP = "harness.impls"
ALL_DTYPES = ("float64", "float32", "bfloat16", "float16")


@dataclass(frozen=True, repr=False)
class Impl:
    """One implementation of a technique's contract, with its declared capabilities."""

    technique: str
    name: str
    fn: Callable[..., Any]
    devices: tuple[str, ...] = ("cpu",)
    dtypes: tuple[str, ...] = ALL_DTYPES
    exact: bool = True  # False: approximate, compared with the technique's approximate tolerance
    mutant: bool = False  # a known-wrong implementation the properties must kill
    killed_by: tuple[str, ...] = ()  # for mutants: the properties that must catch the bug
    bug: str = ""  # for mutants: the real bug it models
    cite: str = ""  # paper and section the algorithm comes from
    caps: Mapping[str, Any] = field(default_factory=dict)  # technique-specific capabilities
    source: str = ""  # module that registered it, or the plugin spec it came from

    def cap(self, key: str, default: Any = None) -> Any:
        return self.caps.get(key, default)

    def __repr__(self) -> str:  # what Hypothesis prints in a falsifying example
        return f"<{self.technique} implementation {self.name!r}>"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))


REGISTRY: dict[tuple[str, str], Impl] = {}


def register(technique: str, name: str, **declared: Any) -> Callable[[Callable], Callable]:
    """Decorator: ``@register("attention", "fa2_b64", dtypes=("float32",), caps={...})``."""

    def add(fn: Callable) -> Callable:
        key = (technique, name)
        if key in REGISTRY:
            raise ValueError(
                f"register: implementation name {name!r} is already registered for technique "
                f"{technique!r} (by {REGISTRY[key].source}); names must be unique"
            )
        REGISTRY[key] = make_impl(technique, name, fn, **declared)
        return fn

    return add


def make_impl(technique: str, name: str, fn: Callable, **declared: Any) -> Impl:
    """Build a record without registering it (used for plugins loaded by `check --plugin`)."""
    unknown = set(declared) - set(Impl.__dataclass_fields__)
    if unknown:
        raise TypeError(f"register: unknown capability field(s) {sorted(unknown)} for {name!r}")
    bad = set(declared.get("dtypes", ())) - set(ALL_DTYPES)
    if bad:
        raise ValueError(f"register: dtypes {sorted(bad)} of {name!r} are not among {ALL_DTYPES}")
    declared.setdefault("source", getattr(fn, "__module__", "") or "")
    declared["caps"] = MappingProxyType(dict(declared.get("caps", {})))
    for key in ("devices", "dtypes", "killed_by"):
        if key in declared:
            declared[key] = tuple(declared[key])
    return Impl(technique=technique, name=name, fn=fn, **declared)


def impls(technique: str, *, mutants: bool | None = False) -> list[Impl]:
    """Implementations of a technique; ``mutants=None`` returns both kinds."""
    load_all()
    return [
        r for (t, _), r in sorted(REGISTRY.items()) if t == technique and (mutants is None or r.mutant == mutants)
    ]


def get(technique: str, name: str) -> Impl:
    load_all()
    try:
        return REGISTRY[(technique, name)]
    except KeyError:
        known = ", ".join(r.name for r in impls(technique, mutants=None)) or "none"
        raise KeyError(f"no implementation {name!r} for technique {technique!r}; known: {known}") from None


LOAD_ERRORS: list[str] = []
_loaded = False


def load_all() -> None:
    """Import every module under `impls/` and every entry point of the plugin group, once.

    A module that fails to import is recorded in LOAD_ERRORS and reported by the CLI; the
    rest still load.
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    import impls

    for info in pkgutil.walk_packages(impls.__path__, prefix="impls."):
        _try_import(info.name, origin=info.name)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        _try_import(ep.value, origin=f"entry point {ep.name} = {ep.value}")


def _try_import(module: str, *, origin: str) -> None:
    try:
        importlib.import_module(module.split(":")[0])
    except Exception as exc:  # a broken plugin must not take the harness down
        last = traceback.format_exception_only(exc)[-1].strip()
        LOAD_ERRORS.append(f"{origin}: failed to import: {last}")
