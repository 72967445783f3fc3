"""Where benchmark results live, and what a result file holds: every reader and writer goes through here.

Committed, written on purpose only (the history backfill, `python -m llm_inference_harness.bench.history steps`, or a
run's files copied there)::

    results/<machine>/machine.json              the machine (provenance.asv_machine())
    results/<machine>/<commit>-<env>.json       asv's result files (format 2: one entry of COLUMNS per benchmark)
    results/steps.json                          steps of the committed history and what `compare` called them

This machine's, git-ignored, under ``provenance.output_root()`` (results/local in a checkout)::

    asv/<machine>/<commit>-<env>.json           its asv runs (the quick pass, the full sweep)
    asv/benchmarks.json                         the suite as asv discovered it (names, grids, versions)
    html/index.html                             the dashboard (`python -m llm_inference_harness.bench.dashboard`)
    report/README.md                            the report (`harness report`)

Nothing generated is committed: the dashboard, the report and the suite's description are rebuilt from the
code and the committed result files whenever they are needed.
"""

from __future__ import annotations

import ast
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from llm_inference_harness.engine import inputs, provenance

COMMITTED = provenance.ROOT / "results"
STEPS = COMMITTED / "steps.json"
# asv's result columns (asv.results, format 2), in the order the history backfill writes them
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
           "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]


def local() -> Path:
    """This machine's asv results: ignored, under output_root() (never results/<committed machine>/)."""
    return provenance.output_root() / "asv"


def html() -> Path:
    """The dashboard's folder: the one place `python -m llm_inference_harness.bench.dashboard` and `harness run` publish
    to."""
    return provenance.output_root() / "html"


def report() -> Path:
    return provenance.output_root() / "report"


def suite_file() -> Path:
    """asv's description of the benchmark suite (benchmarks.json), as the last discovery or run wrote it."""
    return local() / "benchmarks.json"


def machines(root: Path = COMMITTED) -> list[str]:
    """Machines with results under ``root`` (a folder holding <machine>/machine.json)."""
    return sorted(p.parent.name for p in root.glob("*/machine.json"))


def result_files(root: Path, machine: str) -> list[Path]:
    return sorted(p for p in (root / machine).glob("*.json") if p.name != "machine.json")


@dataclass(frozen=True)
class Point:
    """One case of one benchmark at one commit on one machine: asv's value and its recorded spread."""

    benchmark: str
    machine: str
    params: tuple  # the parameter values (Python objects), in the benchmark's parameter order
    commit: str
    env: str  # asv's environment name: the interpreter and the requirements' versions
    date: int  # the commit's date, ms since the epoch (asv's)
    value: float
    q25: float | None
    q75: float | None
    samples: int  # how many samples asv or the backfill took (1: no spread to show)
    version: str  # the benchmark code's version the value was measured at
    committed: bool  # from results/<machine>/ (else this machine's own run)


def points(root: Path, machine: str, benchmark: str | None = None) -> Iterator[Point]:
    """Every measured case (NaN / None: not run, left out) of the result files of ``machine`` under ``root``."""
    for path in result_files(root, machine):
        data = inputs.asv_result(path)  # validated: a bad file is named, not a KeyError deep in a section
        for name, entry in data.get("results", {}).items():
            if benchmark is None or name == benchmark:
                yield from _entry_points(name, machine, data, dict(zip(data["result_columns"], entry, strict=False)),
                                         committed=root == COMMITTED)


def _entry_points(name: str, machine: str, data: dict, column: dict, committed: bool) -> Iterator[Point]:
    params = column.get("params") or []
    combos = itertools.product(*[[ast.literal_eval(p) for p in ps] for ps in params]) if params else [()]
    values = column["result"] if isinstance(column["result"], list) else [column["result"]]
    n = len(values)
    q25, q75 = column.get("stats_q_25") or [None] * n, column.get("stats_q_75") or [None] * n
    counts = column.get("stats_repeat") or column.get("samples") or [None] * n
    for i, (combo, value) in enumerate(zip(combos, values, strict=False)):
        if value is None or isinstance(value, float) and math.isnan(value):
            continue
        count = counts[i] if i < len(counts) else None
        count = len(count) if isinstance(count, list) else count
        yield Point(name, machine, tuple(combo), data["commit_hash"], data.get("env_name", ""), data.get("date", 0),
                    float(value), _number(q25, i), _number(q75, i), int(count or 1), column.get("version", ""),
                    committed)


def _number(column: list, i: int) -> float | None:
    value = column[i] if i < len(column) else None
    return None if value is None or isinstance(value, float) and math.isnan(value) else float(value)
