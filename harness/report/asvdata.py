"""Read benchmark values from asv's results (results/<machine>/<commit>-<env>.json).

The report draws measured curves from the same benchmarks the dashboard shows, so every number
has one source.  Of each machine, the newest result file (by run date) that holds a benchmark is used.
"""

from __future__ import annotations

import ast
import itertools
import json
import math
from functools import cache

from harness.report import ROOT

RESULTS = ROOT / "results"


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
    """{(param values...): value} of ``benchmark`` from the newest run of it on each machine, merged: a CPU
    machine's cpu cases and a GPU machine's cuda cases side by side (where two machines measured the same
    case, the newer run wins).  NaN/None (skipped) are left out."""
    merged: dict[tuple, float] = {}
    machines = set()
    for data in _files():  # newest first
        entry, machine = data["results"].get(benchmark), data.get("params", {}).get("machine")
        if entry is None or machine in machines:
            continue
        columns = data["result_columns"]
        result, params = entry[columns.index("result")], entry[columns.index("params")]
        if result is None:
            continue
        combos = itertools.product(*[[ast.literal_eval(p) for p in ps] for ps in params]) if params else [()]
        out = {combo: v for combo, v in zip(combos, result, strict=False)
               if v is not None and not (isinstance(v, float) and math.isnan(v))}
        if out:
            machines.add(machine)
            merged = out | merged
    if merged:
        return merged
    raise NotImplementedError(f"no asv result for {benchmark} yet: run `python -m harness run` or `tox -e bench`")
