"""Units of work, and how a run is cut into shards balanced by recorded durations.

A unit is the smallest piece of a run that is judged on its own: one property of a technique against one implementation
(``check``), or one mutant to kill (``mutants``: its declared killers first, as
`llm_inference_harness.engine.runner.kill_mutants` does).  Units are listed in the order the unsharded run reports them
(technique, then implementation, then property), so concatenating the shards in order gives the unsharded document's
order.

`plan` cuts that list into ``n`` contiguous runs of about equal expected duration: each shard gets whole
implementations apart from at most one at each end, so it starts few checking processes, and its share
differs from the ideal by at most one unit.  A unit's expected duration is what a previous run recorded for
it (`Durations`: the ``seconds`` of its verdicts in a verdicts document, plus `UNIT_START_S`); a unit no run
recorded gets the mean of the recorded units of its technique and kind, and with nothing recorded the
estimates `CHECK_ESTIMATE_S` and `MUTANT_ESTIMATE_S`.  Every shard of a run must plan from the same durations:
each records a digest of its plan, and `harness merge` refuses shards planned differently.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llm_inference_harness.engine.runner import ImplResult, Target, Verdict

# The means over the whole ci matrix as recorded on a shared 2-core Xeon at load ~12 (docs/scale.md; idle, about a
# quarter): a check unit 1.2 s, a mutant 3.5 s per declared killer.  Only their ratio moves a plan.
CHECK_ESTIMATE_S = 1.2
MUTANT_ESTIMATE_S = 3.5
UNIT_START_S = 0.15  # a unit's checking process: fork, load the implementation, report (docs/scale.md)


@dataclass(frozen=True)
class Unit:
    """One property of ``technique`` against ``target`` (``prop``), or, with ``prop`` None, a mutant to kill.
    ``needs``: devices the implementation declares without the CPU, which a node must have to run it."""

    technique: str
    target: Target
    prop: str | None = None
    needs: tuple[str, ...] = ()
    killers: int = 1  # a mutant's declared killers: what its estimate scales with

    @property
    def kind(self) -> str:
        return "check" if self.prop is not None else "mutant"

    @property
    def key(self) -> tuple[str, ...]:
        return (self.kind, self.technique, self.target.label) + ((self.prop,) if self.prop is not None else ())


@dataclass(frozen=True)
class Job:
    """What every unit of a run is asked: the profile, and the options of `llm_inference_harness.engine.runner.check`
    and `llm_inference_harness.engine.runner.kill_mutants`."""

    profile: str
    shrink: bool = True
    blob: str | None = None
    all_properties: bool = False


def check_units(technique: str, targets: list[Target], props: list[str]) -> list[Unit]:
    """technique x target x property, in the order a check reports them."""
    from llm_inference_harness.engine.registry import impls

    devices = {i.name: i.devices for i in impls(technique, mutants=None)}
    return [Unit(technique, t, p, needs=_needs(devices.get(t.name, ()) if t.name else ())) for t in targets
            for p in props]


def mutant_units(techniques: list[str]) -> list[Unit]:
    """Every registered mutant of ``techniques``, in the order `harness mutants` reports them."""
    from llm_inference_harness.engine.registry import impls

    return [Unit(t, Target(t, name=m.name), needs=_needs(m.devices), killers=max(1, len(m.killed_by)))
            for t in techniques for m in impls(t, mutants=True)]


def _needs(devices: Iterable[str]) -> tuple[str, ...]:
    devices = tuple(devices)
    return () if not devices or "cpu" in devices else devices


# --- shards ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shard:
    index: int  # 1-based, as a CI matrix counts
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``I/N`` with 1 <= I <= N; ValueError naming the flag and what it expects."""
        index, sep, count = text.partition("/")
        if not (sep and index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
            raise ValueError(f"--shard must be I/N with 1 <= I <= N (shard I of N), got {text!r}")
        return cls(int(index), int(count))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass
class Plan:
    """This shard's units out of all of a document's, and the record its verdicts document carries."""

    units: list[Unit]  # this shard's, in report order
    record: dict = field(default_factory=dict)  # empty when the run is not sharded


def plan(units: list[Unit], shard: Shard | None, durations: Durations) -> Plan:
    """The units of ``shard``: ``units`` cut into contiguous runs of about equal expected duration (the
    shard that holds a unit is the one its midpoint falls in)."""
    if shard is None:
        return Plan(list(units))
    expected = [durations.expected(u) for u in units]
    total, start, owner = sum(expected), 0.0, []
    for seconds in expected:
        middle = start + seconds / 2
        owner.append(min(shard.count, int(middle / total * shard.count) + 1) if total else 1)
        start += seconds
    mine = [u for u, s in zip(units, owner, strict=True) if s == shard.index]
    record = {"index": shard.index, "count": shard.count, "units": [list(u.key) for u in mine],
              "total_units": len(units), "all_units": _digest([u.key for u in units]),
              "plan": _digest([[*u.key, s] for u, s in zip(units, owner, strict=True)]),
              "expected_seconds": round(sum(e for e, s in zip(expected, owner, strict=True) if s == shard.index), 1),
              "durations": durations.source}
    return Plan(mine, record)


def _digest(value: object) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


# --- durations -------------------------------------------------------------------------------------------------
class Durations:
    """Seconds per unit that a previous run recorded, read from its verdicts documents (files, or folders of
    them: `harness run` writes one per technique; a `harness merge` output is one too)."""

    def __init__(self, recorded: dict[tuple[str, ...], float] | None = None, source: str = "estimate") -> None:
        self.recorded = recorded or {}
        self.source = source
        by_group: dict[tuple[str, str], list[float]] = {}
        for key, seconds in self.recorded.items():
            by_group.setdefault((key[0], key[1]), []).append(seconds)
        self._means = {group: statistics.fmean(values) for group, values in by_group.items()}

    @classmethod
    def load(cls, paths: list[str]) -> Durations:
        if not paths:
            return cls()
        recorded: dict[tuple[str, ...], float] = {}
        for path in paths:
            files = sorted(Path(path).glob("*.json")) if Path(path).is_dir() else [Path(path)]
            if not files:
                raise ValueError(f"--durations {path}: no verdicts document (*.json) there")
            for file in files:
                try:
                    document = json.loads(file.read_text())
                except (OSError, ValueError) as exc:
                    raise ValueError(f"--durations {file}: not a readable verdicts document ({exc})") from None
                recorded.update(recorded_seconds(document))
        return cls(recorded, source=_digest(sorted([list(k), round(v, 1)] for k, v in recorded.items())))

    def expected(self, unit: Unit) -> float:
        """Recorded seconds, else the mean of its technique's recorded units of its kind, else the estimate."""
        if unit.key in self.recorded:
            return self.recorded[unit.key]
        if (unit.kind, unit.technique) in self._means:
            return self._means[(unit.kind, unit.technique)]
        if unit.kind == "check":
            return CHECK_ESTIMATE_S + UNIT_START_S
        return MUTANT_ESTIMATE_S * unit.killers + UNIT_START_S


def recorded_seconds(document: dict) -> dict[tuple[str, ...], float]:
    """Unit key -> seconds, from a verdicts document of a check or of mutants (every technique in it)."""
    if document.get("schema") != "llm-inference-harness/verdicts":
        raise ValueError("not a verdicts document (schema llm-inference-harness/verdicts)")
    if document.get("kind") == "mutants" and "techniques" in document:
        found: dict[tuple[str, ...], float] = {}
        for part in document["techniques"]:
            found.update(recorded_seconds(part))
        return found
    technique, kind = document["technique"], document["kind"]
    target_of = {i["name"]: i["target"] for i in document["implementations"]}
    found = {}
    for v in document["verdicts"]:
        target = target_of.get(v["impl"], v["impl"])
        key = ("check", technique, target, v["property"]) if kind == "check" else ("mutant", technique, target)
        found[key] = found.get(key, UNIT_START_S) + v["seconds"]
    return found


# --- results as plain data -------------------------------------------------------------------------------------
def result_to_dict(result: ImplResult) -> dict:
    return {"target": asdict(result.target), "info": result.info, "verdicts": [v.as_dict() for v in result.verdicts],
            "stopped": result.stopped, "started": result.started}


def result_from_dict(data: dict) -> ImplResult:
    return ImplResult(Target(**data["target"]), dict(data["info"]), [Verdict(**v) for v in data["verdicts"]],
                      data["stopped"], dict(data["started"]))


def split(result: ImplResult, units: list[Unit]) -> dict[tuple[str, ...], ImplResult]:
    """A target's result cut into its units' (one per property checked; a mutant's is whole)."""
    if units[0].kind == "mutant":
        return {units[0].key: result}
    return {u.key: ImplResult(result.target, result.info, [v for v in result.verdicts if v.property == u.prop],
                              result.stopped, result.started) for u in units}


def gather(units: list[Unit], results: dict[tuple[str, ...], ImplResult]) -> list[ImplResult]:
    """One result per target, in the units' order, its verdicts those of its units in order."""
    by_target: dict[Target, ImplResult] = {}
    for unit in units:
        part = results[unit.key]
        whole = by_target.setdefault(unit.target, ImplResult(unit.target, dict(part.info)))
        whole.info = whole.info or dict(part.info)
        whole.verdicts.extend(part.verdicts)
        whole.stopped = whole.stopped or part.stopped
        whole.started.update(part.started)
    return list(by_target.values())
