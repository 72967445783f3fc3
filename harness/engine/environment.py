"""The HARNESS_* environment variables: what each means, its default and what a value must be, in one table, and
the one function that reads them.

Each is read by `value` when it is used (never at import), so a command validates every one that is set (`check`,
called by the command line's `validate`) before any work starts: a bad value -- "abc", "-1", "", "nan", "inf" for a
number of seconds -- is a one-line usage error naming the variable, its value and what it expects (exit 2), never a
traceback and never silently the default.  A variable that is set means what it says: an empty value is an error
too (unset it for the default).  The defaults are those README.md documents.

Set by the harness itself for the processes it starts, and not meant to be set by hand (not validated):
HARNESS_EXAMPLE_DB_SCOPE (the implementation a Hypothesis example belongs to) and HARNESS_UNIT_PROFILE (a Ray
worker pool's profile).  The test suite's own switches (HARNESS_SUITE_ISOLATED, HARNESS_CLUSTER_TESTS) are
conftest.py's and .ci/run's.

UsageError, the base of every bad-input error, is defined here, below everything (llm_inference_harness.engine.inputs,
where the readers of files live, re-exports it): provenance reads HARNESS_OUT through this module, and inputs imports
provenance.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DEVICES = ("cpu", "cuda")


class UsageError(Exception):
    """Bad input to a command -- an argument, a path, a file it reads: printed as one line, exit code 2."""


class BadVariable(UsageError):
    """A HARNESS_* variable set to a value the harness cannot use: its name, the value and what it expects."""


@dataclass(frozen=True)
class Variable:
    name: str
    expects: str  # what a value must be, for the error
    default: str  # the documented default, in words
    parse: Callable[[str], object]  # the value from its text; ValueError when it is not one
    unset: object = None  # what `value` returns when the variable is not set


def _positive(text: str) -> float:
    number = float(text)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(text)
    return number


def _devices(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    if not all(name in DEVICES for name in names):
        raise ValueError(text)
    return names


def _names(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    if not all(name.strip() for name in names):
        raise ValueError(text)
    return names


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(text)
    return text == "1"


def _folder(text: str) -> Path:
    if not text.strip():
        raise ValueError(text)
    return Path(text)


def _redis_url(text: str) -> str:
    if not text.startswith(("redis://", "rediss://", "unix://")) or not text.partition("://")[2]:
        raise ValueError(text)
    return text


SECONDS = "a number of seconds > 0"
VARIABLES: dict[str, Variable] = {v.name: v for v in [
    Variable("HARNESS_OUT", "a folder", "results/local of the checkout, else ./harness-results", _folder),
    Variable("HARNESS_MEMORY_LIMIT_GB", "a number of GiB > 0 (a checking process's address space)",
             "half the machine's RAM, at most 16", _positive),
    Variable("HARNESS_PER_IMPL_LIMIT_S", SECONDS + " (a whole implementation's check)", "900", _positive, 900.0),
    Variable("HARNESS_IMPORT_LIMIT_S", SECONDS + " (importing and registering a plugin)", "180", _positive, 180.0),
    Variable("HARNESS_DEVICES", f"a comma-separated list of {', '.join(DEVICES)}", "every device present", _devices,
             ()),
    Variable("HARNESS_ENTRY_POINTS", "comma-separated names of installed entry points, or 'all'", "none", _names, ()),
    Variable("HARNESS_TRUSTED_IN_PROCESS", "0 or 1", "0", _flag, False),
    Variable("HARNESS_EXAMPLE_DB", "redis://HOST:PORT/DB (or rediss://, unix://) of a Redis server", "none",
             _redis_url),
    Variable("HARNESS_EXAMPLE_DB_WRITE", "0 or 1", "0", _flag, False),
    Variable("HARNESS_EXAMPLE_DB_LOCAL", "a folder", "examples/ in the results folder", _folder),
]}


def value(name: str):
    """The value of the HARNESS_* variable ``name`` (its table's ``unset`` when it is not set); BadVariable naming
    it, its value and what it expects when that is not a value of it."""
    variable = VARIABLES[name]
    text = os.environ.get(name)
    if text is None:
        return variable.unset
    try:
        return variable.parse(text)
    except ValueError:
        raise BadVariable(f"{name}={text!r}: expected {variable.expects} (unset: {variable.default})") from None


def check() -> None:
    """Every HARNESS_* variable of the table that is set, validated (BadVariable for the first bad one)."""
    for name in VARIABLES:
        value(name)
