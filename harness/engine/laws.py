"""A property's test as a run needs it, through Hypothesis's public API: as imported, unshrunk (a mutant's kill
needs the first failing example, not a minimal one), or replaying one failure Hypothesis printed.

A @given test takes its settings when it is decorated, from the profile loaded then (Hypothesis reads no later
change of profile), so a test that must run without shrinking, or replay a printed failure, is a fresh execution of
its property module: its tests are decorated anew, under the settings this run needs.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the runner imports this module: its record is named for type checking only
    from llm_inference_harness.engine.runner import Property


def law(prop: Property, *, shrink: bool, blob: str | None) -> Callable:
    """``prop``'s test: as imported; unshrunk (without Hypothesis's shrink and explain phases: shrinking a
    mutant's failure replays hundreds of variations, minutes for a model-sized example, to learn nothing the kill
    needs); or replaying ``blob``, the ``VERSION:DATA`` of a failure Hypothesis printed (@reproduce_failure)."""
    if blob:
        from hypothesis import reproduce_failure

        version, _, data = blob.partition(":")
        fn = getattr(_fresh(prop.module), f"test_{prop.name}")
        for f in _wrapper_chain(fn):  # the @given test reads it at each call, under any decorator's wrapper
            if hasattr(f, "hypothesis"):
                reproduce_failure(version, data.encode())(f)
        return fn
    if shrink:
        return prop.fn
    from hypothesis import settings

    with shrinking(False):
        key = (prop.module, repr(settings.default))
        if key not in _UNSHRUNK:
            _UNSHRUNK[key] = _fresh(prop.module)
        return getattr(_UNSHRUNK[key], f"test_{prop.name}")


_UNSHRUNK: dict[tuple[str, str], object] = {}  # (module, the profile's settings) -> its unshrunk execution


def _fresh(module: str) -> object:
    """A new execution of a property module, not entered in sys.modules (the imported one stays as it is)."""
    spec = importlib.util.find_spec(module)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    return fresh


@contextlib.contextmanager
def shrinking(shrink: bool) -> Iterator[None]:
    """The default profile, which a state machine run with ``settings.default`` reads at run time, without the
    shrink and explain phases unless ``shrink``."""
    if shrink:
        yield
        return
    from hypothesis import Phase, settings

    default = settings.default
    settings.register_profile("harness-unshrunk", default, phases=[
        p for p in default.phases if p not in (Phase.shrink, Phase.explain)])
    settings.load_profile("harness-unshrunk")
    try:
        yield
    finally:
        settings.register_profile("harness-shrinking", default)  # the profile as it was: load_profile takes a name
        settings.load_profile("harness-shrinking")


def _wrapper_chain(fn: Callable) -> list[Callable]:
    """``fn`` and the functions it wraps (``__wrapped__``, as functools.wraps records them)."""
    chain = [fn]
    while (inner := getattr(chain[-1], "__wrapped__", None)) is not None and inner not in chain:
        chain.append(inner)
    return chain
