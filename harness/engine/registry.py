"""The registry: one dict of frozen records, one decorator, one entry-point group.

Every implementation of every technique -- ours, mutants, and third-party plugins -- is an `Impl`
record in `REGISTRY`, keyed by ``(technique, name)``.  Capabilities are declared and typed (each
contract's `Caps` dataclass, harness/engine/capabilities.py), never discovered by crashing: the property
runner reads them to decide what applies.

Implementations come in through the entry-point group ``harness.impls``: this project's own (its
``impls.<technique>`` packages, named in pyproject.toml) always load; another distribution's load only
when asked for (`enable_entry_points`, ``--entry-points`` or HARNESS_ENTRY_POINTS), each first imported
in a throwaway child process, so one that crashes, exits or hangs at import is reported and skipped.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llm_inference_harness.contracts import technique as contract
from llm_inference_harness.engine import environment
from llm_inference_harness.engine.capabilities import Caps, build

ENTRY_POINT_GROUP = "harness.impls"
DISTRIBUTION = "llm-inference-harness"
ALL_DTYPES = ("float64", "float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")


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
    caps: Caps = Caps()  # the technique's typed capabilities (harness/contracts/<technique>.py)
    source: str = ""  # the module whose `register` call made it (not its callable's), or the plugin spec
    unavailable: str = ""  # why it cannot run on this machine (a library not installed): every property skips

    def __repr__(self) -> str:  # what Hypothesis prints in a falsifying example
        return f"<{self.technique} implementation {self.name!r}>"

    def _repr_pretty_(self, printer, _cycle) -> None:
        printer.text(repr(self))


REGISTRY: dict[tuple[str, str], Impl] = {}
FIELDS = tuple(f for f in Impl.__dataclass_fields__ if f not in ("technique", "name", "fn"))


def register(technique: str, name: str, **declared: Any) -> Callable[[Callable], Callable]:
    """Decorator: ``@register("attention", "fa2_b64", dtypes=("float32",), caps={...})``.

    The record's ``source`` is the module that calls `register` (unless declared): a file that registers an instance
    of a class defined in another file (impls/speculative/adaptive.py registers standard.py's SpeculativeSampling) is
    the implementation's file, to the mutation tool and the reports, not the file its callable's ``__module__`` names.
    """
    caller = sys._getframe(1).f_globals.get("__name__")
    if caller and "source" not in declared:
        declared["source"] = caller

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
    """Build a record without registering it (used for plugins loaded by `check --plugin`).

    Raises TypeError/ValueError naming the field or capability at fault, listing the valid ones."""
    who = f"register({technique!r}, {name!r})"
    unknown = sorted(set(declared) - set(FIELDS))
    if unknown:
        raise TypeError(f"{who}: unknown field(s) {unknown}; the valid ones are {', '.join(FIELDS)} "
                        "(technique-specific capabilities go in caps={...})")
    for key, allowed in (("dtypes", ALL_DTYPES), ("devices", DEVICES)):
        if key in declared:
            if isinstance(declared[key], str) or not all(isinstance(x, str) for x in declared[key]):
                raise TypeError(f"{who}: {key} must be a tuple of names among {allowed}, got {declared[key]!r}")
            declared[key] = tuple(declared[key])
            bad = sorted(set(declared[key]) - set(allowed))
            if bad:
                raise ValueError(f"{who}: {key} {bad} are not among {allowed}")
    if "killed_by" in declared:
        declared["killed_by"] = tuple(declared["killed_by"])
    declared["caps"] = build(contract(technique).caps, declared.get("caps", {}), who=who)
    declared.setdefault("source", getattr(fn, "__module__", "") or "")
    return Impl(technique=technique, name=name, fn=fn, **declared)


@dataclass(frozen=True)
class KnownFailure:
    """A real bug of a third-party library, found by a property and recorded next to its adapter: the matrix
    shows ``upstream`` for it (not pass, not FAIL), and ``stale`` (a failure) once it stops reproducing."""

    technique: str
    impl: str
    property: str
    library: str  # the distribution, e.g. "torchao"
    version: str  # the version the failure was recorded with
    what: str  # what the library does wrong, in a sentence
    reproduce: str  # a minimal reproduction: a few lines of Python using the library alone


KNOWN_FAILURES: dict[tuple[str, str, str], KnownFailure] = {}


def known_failure(technique: str, impl: str, prop: str, *, library: str, version: str, what: str,
                  reproduce: str) -> None:
    """Record that ``impl`` fails ``prop`` because of a bug of ``library`` (not of the adapter)."""
    KNOWN_FAILURES[(technique, impl, prop)] = KnownFailure(technique, impl, prop, library, version, what, reproduce)


def library_unavailable(module: str, *, install: str) -> str:
    """'' when ``module`` can be imported here (found without importing it: a heavy library is imported at its
    adapter's first call), else the skip reason an adapter registers with, saying how to install it."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        found = False
    return "" if found else f"{module} is not installed here ({install})"


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
_enabled: set[str] = set()  # by enable_entry_points; HARNESS_ENTRY_POINTS is read when they load
PROBE_LIMIT_S = 60.0


def enable_entry_points(names: list[str]) -> None:
    """Also load these entry points of other distributions (``all``: every one), each probed in a child first."""
    global _loaded
    if set(names) - _enabled:
        _enabled.update(names)
        _loaded = False


def load_all() -> None:
    """Import this project's entry points, and the other distributions' ones that were enabled, once.

    A module that fails to import is recorded in LOAD_ERRORS (reported by the CLI); the rest still load.
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    ours, theirs = [], []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        (ours if ep.dist is not None and ep.dist.name == DISTRIBUTION else theirs).append(ep)
    if not ours:
        LOAD_ERRORS.append(f"no entry points of {DISTRIBUTION} in group {ENTRY_POINT_GROUP}: install the project "
                           "(pip install -e .) so that its implementations register")
    for ep in ours:
        _try_import(ep.value, origin=f"entry point {ep.name} = {ep.value}")
    enabled = _enabled | set(environment.value("HARNESS_ENTRY_POINTS"))
    for ep in theirs:
        if "all" in enabled or ep.name in enabled or ep.value in enabled:
            origin = f"entry point {ep.name} = {ep.value} (of {ep.dist.name if ep.dist else 'unknown'})"
            try:
                for info in describe(ep.value):
                    _register_elsewhere(ep.value, info)
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the harness down
                LOAD_ERRORS.append(f"{origin}: {exc}; skipped")


class Elsewhere:
    """The ``fn`` of an implementation from another distribution: it is imported and called only in a process of
    its own (harness/engine/boundary.py), never in the harness's; here it is a name and what it declared."""

    def __init__(self, module: str, technique: str, name: str) -> None:
        self.module, self.technique, self.name = module, technique, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.name} comes from {self.module}, another distribution: it runs only in a process "
                           f"of its own (harness check {self.technique} --impl {self.name})")


def describe(module: str, limit_s: float = PROBE_LIMIT_S) -> list[dict]:
    """What importing ``module`` registers, learned in a process of its own (which then ends): the records'
    declarations, read as plain data.  RuntimeError saying what went wrong (a crash, an exit, a hang)."""
    from llm_inference_harness.engine.boundary import LoadFailed, PluginProcess
    from llm_inference_harness.engine.guard import BoundaryFailure

    process = PluginProcess.start({"describe": module}, _describe, capture=os.devnull)
    try:
        return process.described(limit_s)
    except (LoadFailed, BoundaryFailure) as exc:
        raise RuntimeError(str(exc).replace("the implementation's process", "the process importing it")) from None
    finally:
        process.close()


def _describe(conn: Any, options: dict) -> None:
    """In the probing process, confined (harness/engine/confine.py): import the module and send the declarations of
    what it registered, or why the import failed."""
    from llm_inference_harness.engine import wire
    from llm_inference_harness.engine.confine import where

    def refused(obj: Any) -> Any:
        raise TypeError(f"a declaration holds a {type(obj).__name__}, not plain data")

    module, before = options["load"]["describe"], set(REGISTRY)
    try:
        importlib.import_module(module.split(":")[0])
        infos = wire.Encoder(refused).encode([info(REGISTRY[key]) for key in sorted(set(REGISTRY) - before)])
    except BaseException as exc:  # noqa: BLE001 - a module that fails to import is reported, not a crash
        conn.send_bytes(wire.dumps(("load_failed",
                                    f"{where(exc, None)}{''.join(traceback.format_exception_only(exc)).strip()}")))
        return
    conn.send_bytes(wire.dumps(("described", infos)))


def info(impl: Impl) -> dict:
    """What a record declares, as plain data (sent by the implementation's process, reported with its verdicts)."""
    return {"name": impl.name, "technique": impl.technique, "mutant": impl.mutant, "exact": impl.exact,
            "killed_by": impl.killed_by, "bug": impl.bug, "devices": impl.devices, "dtypes": impl.dtypes,
            "caps": impl.caps.declared(), "source": impl.source, "cite": impl.cite,
            "unavailable": impl.unavailable}


def _register_elsewhere(module: str, info: dict) -> None:
    fields = {k: info[k] for k in FIELDS if k in info and k != "caps"}
    record = make_impl(str(info["technique"]), str(info["name"]), Elsewhere(module, info["technique"], info["name"]),
                       caps=info.get("caps", {}), **fields)
    if (record.technique, record.name) not in REGISTRY:
        REGISTRY[(record.technique, record.name)] = record


def load_elsewhere(record: Impl) -> Impl:
    """In the implementation's own process: import the distribution that registered ``record`` and return what it
    registered under that name."""
    if isinstance(record.fn, Elsewhere):
        for key in [k for k, r in REGISTRY.items() if isinstance(r.fn, Elsewhere) and r.fn.module == record.fn.module]:
            del REGISTRY[key]
        importlib.import_module(record.fn.module.split(":")[0])
        return REGISTRY[(record.technique, record.name)]
    return record


def _try_import(module: str, *, origin: str) -> None:
    try:
        importlib.import_module(module.split(":")[0])
    except Exception as exc:  # a broken plugin must not take the harness down
        last = traceback.format_exception_only(exc)[-1].strip()
        LOAD_ERRORS.append(f"{origin}: failed to import: {last}")
