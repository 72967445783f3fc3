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
class Technique:
    name: str
    signature: str  # the contract, as a Python signature
    summary: str  # one line
    # modules holding the property tests, e.g. ("llm_inference_harness.properties.test_attention",)
    properties: tuple[str, ...]
    reference: str  # name of the registered float64 oracle ("" when the oracle is not an impl)
    caps: type[Caps] = Caps  # the capabilities its implementations may declare


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
