"""Read benchmark values from asv's results (llm_inference_harness.bench.results), saying where each came from.

The report draws measured curves from the same benchmarks the dashboard shows, so every number has one
source, and it measures nothing itself.  By default a value is this machine's: from its own runs
(llm_inference_harness.bench.results.local(), the ignored folder `harness run` writes) or from the committed
results/<name>/ of the same hardware name (provenance.machine_name()); a committed result of another machine is
read only when asked for by name, for a comparison the report labels as such.  Each case is read from the newest
run that measured it at the benchmark's current version: a run of a few cases (a parameter regex, a GPU
session's batches) replaces those cases and leaves the others as they were, and a case measured before its
benchmark's code changed is not shown, as the dashboard does not show it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from llm_inference_harness.bench import results as results_paths
from llm_inference_harness.engine import inputs, provenance

RESULTS = results_paths.COMMITTED


def roots() -> list[Path]:
    """Where results are read from, this machine's own runs first: the local folder, then the committed one."""
    return [results_paths.local(), RESULTS]


@dataclass(frozen=True)
class Source:
    machine: str
    commit: str
    committed: bool
    date: int = 0  # the commit's date, ms since the epoch

    def __str__(self) -> str:
        day = f", {time.strftime('%Y-%m-%d', time.gmtime(self.date / 1000))}" if self.date else ""
        return f"{self.machine} at {self.commit[:8]}{day}" + ("" if self.committed else " (this machine's run)")


class Values(dict):
    """{case (parameter values): value}, with ``sources`` {case: Source} and ``spread`` {case: (q25, q75)}
    where asv recorded one."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: dict[tuple, Source] = {}
        self.spread: dict[tuple, tuple[float, float]] = {}

    def where(self, keys=None) -> str:
        """'xeon-amx-2c-24g at 61a7c377, 2026-12-01' (every source of these cases, the most frequent first)."""
        found = [self.sources[k] for k in (self if keys is None else keys) if k in self.sources]
        counts = {s: found.count(s) for s in found}
        return "; ".join(str(s) for s in sorted(counts, key=counts.get, reverse=True)) or "nowhere"


@cache
def current_versions() -> dict[str, str]:
    """{benchmark: version} of this checkout's suite, as asv discovers it from the code
    (llm_inference_harness.bench.asvrun.suite); {} (every version read) outside a checkout, where there is no suite to
    discover."""
    from llm_inference_harness.bench.asvrun import suite

    if provenance.checkout() is None:
        return {}
    return {name: b["version"] for name, b in suite().items() if isinstance(b, dict)}


def read_all() -> None:
    """Read (and validate: llm_inference_harness.engine.inputs) every result and machine file the report may read."""
    current_versions()
    for root in roots():
        for machine in results_paths.machines(root):
            inputs.asv_machine(root / machine / "machine.json")
            for _ in results_paths.points(root, machine):
                pass


def machines() -> list[str]:
    """Machines with committed results (results/<name>/machine.json)."""
    return results_paths.machines(RESULTS)


def values(benchmark: str, machine: str | None = None) -> Values:
    """{(param values...): value} of ``benchmark`` on ``machine`` (default: this one), each case from the newest
    run (by commit date) that measured it at the current benchmark version.  Cases not run are left out."""
    machine = machine or provenance.machine_name()
    version = current_versions().get(benchmark)
    found = [(p, root == RESULTS) for root in roots() for p in results_paths.points(root, machine, benchmark)
             if version is None or p.version == version]
    merged = Values()
    for p, committed in sorted(found, key=lambda f: f[0].date, reverse=True):  # newest first: the first read stays
        if p.params in merged:
            continue
        merged[p.params] = p.value
        merged.sources[p.params] = Source(machine, p.commit, committed, p.date)
        if p.q25 is not None and p.q75 is not None:
            merged.spread[p.params] = (p.q25, p.q75)
    if merged:
        return merged
    raise NotImplementedError(f"no asv result for {benchmark} on {machine} yet: run `harness run` "
                              "(the quick pass) or `python -m llm_inference_harness.bench.quickbench full`")
