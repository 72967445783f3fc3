"""Read benchmark values from asv's results (<results>/<machine>/<commit>-<env>.json), saying where each came from.

The report draws measured curves from the same benchmarks the dashboard shows, so every number has one
source.  By default a value is this machine's: from its own runs (harness.asvrun.local_results(), the
ignored folder `python -m harness run` writes) or from the committed results/<name>/ of the same hardware name
(provenance.machine_name()); a committed result of another machine is read only when asked for by name, for a
comparison the report labels as such.  Each case is read from the newest run that measured it at the
benchmark's current version: a run of a few cases (a parameter regex, a GPU session's batches) replaces those
cases and leaves the others as they were, and a case measured before its benchmark's code changed is not
shown, as the dashboard does not show it.
"""

from __future__ import annotations

import ast
import itertools
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harness import provenance
from harness.engine import inputs

RESULTS = provenance.ROOT / "results"


def roots() -> list[Path]:
    """Where results are read from, this machine's own runs first: the local folder, then the committed one."""
    from harness.asvrun import local_results

    return [local_results(), RESULTS]


@dataclass(frozen=True)
class Source:
    machine: str
    commit: str
    committed: bool

    def __str__(self) -> str:
        return f"{self.machine} at {self.commit[:8]}" + ("" if self.committed else " (this machine's run)")


class Values(dict):
    """{case (parameter values): value}, with ``sources`` {case: Source} and ``spread`` {case: (q25, q75)}
    where asv recorded one."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: dict[tuple, Source] = {}
        self.spread: dict[tuple, tuple[float, float]] = {}

    def where(self, keys=None) -> str:
        """'xeon-amx-2c-24g at 61a7c377' (every source of these cases, the most frequent first)."""
        found = [self.sources[k] for k in (self if keys is None else keys) if k in self.sources]
        counts = {s: found.count(s) for s in found}
        return "; ".join(str(s) for s in sorted(counts, key=counts.get, reverse=True)) or "nowhere"


@cache
def current_versions() -> dict[str, str]:
    """{benchmark: version} of the benchmarks as asv last discovered them: this machine's last run's
    benchmarks.json (the installed code's), else the committed results/benchmarks.json."""
    path = next((root / "benchmarks.json" for root in roots() if (root / "benchmarks.json").is_file()), None)
    if path is None:
        return {}
    return {name: b["version"] for name, b in inputs.asv_benchmarks(path).items() if isinstance(b, dict)}


@cache
def _files(machine: str) -> list[tuple[Source, dict]]:
    found = []
    for root in roots():
        for path in (root / machine).glob("*.json"):
            if path.name == "machine.json":
                continue
            data = inputs.asv_result(path)
            found.append((Source(machine, data["commit_hash"], root == RESULTS), data))
    return sorted(found, key=lambda f: f[1].get("date", 0), reverse=True)


def read_all() -> None:
    """Read (and validate: harness.engine.inputs) every result, machine and benchmarks file the report may read."""
    current_versions()
    for root in roots():
        for machine_json in sorted(root.glob("*/machine.json")):
            inputs.asv_machine(machine_json)
            _files(machine_json.parent.name)


def machines() -> list[str]:
    """Machines with committed results (results/<name>/machine.json)."""
    return sorted(p.parent.name for p in RESULTS.glob("*/machine.json"))


def values(benchmark: str, machine: str | None = None) -> Values:
    """{(param values...): value} of ``benchmark`` on ``machine`` (default: this one), each case from the newest
    run (by commit date) that measured it at the current benchmark version.  NaN/None (skipped) are left out."""
    machine = machine or provenance.machine_name()
    version = current_versions().get(benchmark)
    merged = Values()
    for source, data in _files(machine):  # newest first: a case already read keeps its newer value
        entry = data["results"].get(benchmark)
        if entry is None:
            continue
        column = dict(zip(data["result_columns"], entry, strict=False))
        if column["result"] is None or version is not None and column.get("version") != version:
            continue
        params = column["params"]
        combos = itertools.product(*[[ast.literal_eval(p) for p in ps] for ps in params]) if params else [()]
        q25, q75 = column.get("stats_q_25") or [], column.get("stats_q_75") or []
        for i, (combo, v) in enumerate(zip(combos, column["result"], strict=False)):
            if combo in merged or v is None or isinstance(v, float) and math.isnan(v):
                continue
            merged[combo], merged.sources[combo] = v, source
            if i < len(q25) and i < len(q75) and q25[i] is not None and q75[i] is not None:
                merged.spread[combo] = (q25[i], q75[i])
    if merged:
        return merged
    raise NotImplementedError(f"no asv result for {benchmark} on {machine} yet: run `python -m harness run` "
                              "(the quick pass) or `python -m harness.quickbench full`")
