"""Techniques and their contracts.

A `Technique` names the call signature every implementation honours, where its properties live
and how a plugin is written.  Each technique's module in this package adds itself to
`TECHNIQUES` and provides the guarded call that properties use.

Imports the engine's core (capabilities, guard) and sampling (the speculative contract is written against
`sampling.lm.LM`); the registry imports the contracts, which name its `Impl` for type checking only.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

from llm_inference_harness.engine.capabilities import Caps


@dataclass(frozen=True)
class Rule:
    """One clause of a technique's contract (its module's docstring states them in full): a short name, the clause
    in one line, and the properties that judge it.  A failing property's verdict, and its pytest failure, name the
    rules it judges (`Technique.rules_of`), so a reader learns which promise broke, not only which assertion."""

    name: str  # "bonus", "bad input"
    text: str  # the clause, one line
    properties: tuple[str, ...]  # the names of the properties (tests without "test_") that judge it

    def cite(self, technique: str) -> str:
        return f"the {technique} contract's {self.name} rule: {self.text}"


def batch_rules(*chunked: str) -> tuple[Rule, Rule]:
    """The rules of a technique with `BatchedCaps`, each judged where the implementation declares it: batch
    invariance (``chunked``: the properties that split a row's queries too) and determinism."""
    return (Rule("batch invariance", "a declared batch_invariant row has the bits of that row computed alone, in any "
                                     "batch composition or order", ("rows_are_batch_invariant", *chunked)),
            Rule("determinism", "a declared deterministic call gives the same bits every run and at any thread count",
                 ("same_bits_every_run_and_thread_count",)))


@dataclass(frozen=True)
class Technique:
    name: str
    signature: str  # the contract, as a Python signature
    summary: str  # one line
    # modules holding the property tests, e.g. ("llm_inference_harness.properties.test_attention",)
    properties: tuple[str, ...]
    reference: str  # name of the registered float64 oracle ("" when the oracle is not an impl)
    caps: type[Caps] = Caps  # the capabilities its implementations may declare
    rules: tuple[Rule, ...] = ()  # its contract's clauses, each with the properties that judge it

    def rules_of(self, prop: str) -> tuple[Rule, ...]:
        """The rules property ``prop`` (its name without "test_") judges."""
        return tuple(r for r in self.rules if prop in r.properties)


TECHNIQUES: dict[str, Technique] = {}


def define(technique: Technique) -> Technique:
    if technique.name in TECHNIQUES:
        raise ValueError(f"technique {technique.name!r} is defined twice")
    TECHNIQUES[technique.name] = technique
    return technique


def load_techniques() -> dict[str, Technique]:
    for info in pkgutil.iter_modules(__path__, prefix=f"{__name__}."):
        importlib.import_module(info.name)
    return TECHNIQUES


def technique(name: str) -> Technique:
    load_techniques()
    if name not in TECHNIQUES:
        raise KeyError(f"unknown technique {name!r}; known: {', '.join(sorted(TECHNIQUES))}")
    return TECHNIQUES[name]
