"""Run a technique's properties against one implementation and turn the outcome into verdicts.

Properties are ordinary Hypothesis tests in ``properties/test_<technique>.py`` that take an
``impl`` argument; pytest parametrizes them over the registry (see conftest.py) and this runner
calls them directly for ``python -m harness check`` / ``mutants``.  A property may declare when
it applies with `@applies(...)`; an implementation it does not apply to gets a skip verdict
carrying the declared reason.
"""

from __future__ import annotations

import importlib
import inspect
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from harness.contracts import technique as get_technique
from harness.guard import hang_message
from harness.registry import Impl

Predicate = Callable[[Impl], "str | None"]  # returns a skip reason, or None when the property applies


def applies(predicate: Predicate) -> Callable[[Callable], Callable]:
    """Declare when a property applies: ``@applies(lambda impl: None if impl.exact else "approximate")``."""

    def mark(fn: Callable) -> Callable:
        fn.harness_applies = [*getattr(fn, "harness_applies", []), predicate]
        return fn

    return mark


def needs_cap(cap: str, why: str) -> Callable[[Callable], Callable]:
    return applies(lambda impl: None if impl.cap(cap) else f"{impl.name} does not declare {cap!r} ({why})")


def needs_dtype(*dtypes: str) -> Callable[[Callable], Callable]:
    return applies(lambda impl: None if set(dtypes) & set(impl.dtypes) else f"declares none of {dtypes}")


@dataclass(frozen=True)
class Property:
    name: str  # the test's name without "test_"
    fn: Callable
    module: str

    def skip_reason(self, impl: Impl) -> str | None:
        for predicate in getattr(self.fn, "harness_applies", []):
            reason = predicate(impl)
            if reason:
                return reason
        return None


@dataclass
class Verdict:
    impl: str
    property: str
    status: str  # "pass" | "FAIL" | "skip"
    message: str = ""
    counterexample: str = ""
    reproduce: str = ""
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def properties_of(technique: str) -> list[Property]:
    module = importlib.import_module(get_technique(technique).properties)
    found = []
    for name, fn in vars(module).items():
        if name.startswith("test_") and callable(fn) and "impl" in inspect.signature(fn).parameters:
            found.append(Property(name.removeprefix("test_"), fn, module.__name__))
    return found


def run_property(prop: Property, impl: Impl, *, profile: str, plugin: str | None = None) -> Verdict:
    reason = prop.skip_reason(impl)
    if reason:
        return Verdict(impl.name, prop.name, "skip", message=reason)
    start = time.perf_counter()
    try:
        prop.fn(impl=impl)
    except Exception as exc:  # noqa: BLE001 - any failure of the property is a verdict
        return Verdict(
            impl.name, prop.name, "FAIL", message=hang_message(impl.fn) or _first_line(exc),
            counterexample=_counterexample(exc),
            reproduce=reproduce_command(impl, prop, profile, plugin), seconds=time.perf_counter() - start,
        )
    return Verdict(impl.name, prop.name, "pass", seconds=time.perf_counter() - start)


def reproduce_command(impl: Impl, prop: Property, profile: str, plugin: str | None) -> str:
    source = f"--plugin {plugin}" if plugin else f"--impl {impl.name}"
    return f"python -m harness check {impl.technique} {source} --property {prop.name} --profile {profile}"


def kill_mutant(mutant: Impl, props: list[Property], *, profile: str, all_properties: bool) -> list[Verdict]:
    """Run the mutant's declared killers first; with ``all_properties`` run the rest too."""
    ordered = sorted(props, key=lambda p: p.name not in mutant.killed_by)
    verdicts = []
    for prop in ordered:
        verdicts.append(run_property(prop, mutant, profile=profile))
        if not all_properties and verdicts[-1].status == "FAIL" and prop.name in mutant.killed_by:
            break
    return verdicts


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):  # Hypothesis found several distinct failures: name the first
        return f"{len(exc.exceptions)} distinct failures; the first: {_first_line(exc.exceptions[0])}"[:400]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


def _counterexample(exc: BaseException) -> str:
    """The failing example Hypothesis attached to the exception; one per failure when it found several."""
    if isinstance(exc, BaseExceptionGroup):
        return "\n\n".join(f"failure {i} of {len(exc.exceptions)}: {_first_line(sub)}\n{_counterexample(sub)}"
                           for i, sub in enumerate(exc.exceptions, 1))
    notes = [n for n in getattr(exc, "__notes__", []) if "These lines were always" not in n
             and not n.lstrip().startswith(("Explanation:", "/"))]
    text = "\n".join(notes)
    return re.sub(r"\n{3,}", "\n\n", text).strip()
