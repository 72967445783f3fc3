"""Read benchmark values from asv's results (results/<machine>/<commit>-<env>.json).

The report draws measured curves from the same benchmarks the dashboard shows, so every number
has one source.  Each case (one parameter combination) is read from the newest run that measured it at
the benchmark's current version: a run of a few cases (a parameter regex, a GPU session's batches)
replaces those cases and leaves the others as they were, and a case measured before its benchmark's
code changed is not shown, as the dashboard does not show it.
"""

from __future__ import annotations

import ast
import itertools
import json
import math
from functools import cache

from harness.provenance import ROOT

RESULTS = ROOT / "results"


@cache
def current_versions() -> dict[str, str]:
    """{benchmark: version} of the benchmarks as asv last discovered them (results/benchmarks.json)."""
    path = RESULTS / "benchmarks.json"
    if not path.is_file():
        return {}
    return {name: b["version"] for name, b in json.loads(path.read_text()).items() if isinstance(b, dict)}


@cache
def _files() -> list[dict]:
    found = []
    for path in RESULTS.glob("*/*.json"):
        if path.name in ("machine.json", "benchmarks.json"):
            continue
        data = json.loads(path.read_text())
        if "results" in data:
            found.append(data)
    return sorted(found, key=lambda d: d.get("date", 0), reverse=True)


def values(benchmark: str) -> dict[tuple, float]:
    """{(param values...): value} of ``benchmark``, each case from the newest run (by commit date) that
    measured it at the current benchmark version, over every machine: a CPU machine's cpu cases and a GPU
    machine's cuda cases side by side.  NaN/None (skipped) are left out."""
    version = current_versions().get(benchmark)
    merged: dict[tuple, float] = {}
    for data in _files():  # newest first: a case already read keeps its newer value
        entry = data["results"].get(benchmark)
        if entry is None:
            continue
        columns = data["result_columns"]
        result, params = entry[columns.index("result")], entry[columns.index("params")]
        if result is None or version is not None and entry[columns.index("version")] != version:
            continue
        combos = itertools.product(*[[ast.literal_eval(p) for p in ps] for ps in params]) if params else [()]
        out = {combo: v for combo, v in zip(combos, result, strict=False)
               if v is not None and not (isinstance(v, float) and math.isnan(v))}
        merged = out | merged
    if merged:
        return merged
    raise NotImplementedError(f"no asv result for {benchmark} yet: run `python -m harness run` or `tox -e bench`")
