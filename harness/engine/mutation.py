"""Machine-made mutants: cosmic-ray's mutation operators over impls/ and the README's example plugins, each mutant
judged by its technique's `check` (llm_inference_harness.engine.runner) in the profile asked for, in its own process
like any plugin.

Why cosmic-ray (8.x) and not mutmut (3.x): cosmic-ray's operators are a library -- `mutate_code(source, operator,
occurrence)` on a parso tree -- so a mutant is a text we write to a file of our own and check as a plugin: the tree
under test is never edited in place, and a unit of work carries its source, so any executor on any host can judge
it.  mutmut copies the project into ``mutants/`` with trampolines switched by an environment variable and runs
pytest itself: its unit of judgement is a pytest selection, not a check with verdicts per property.

A file of impls/ is judged through the implementations it registers (its registrations are collected from the
mutated text into a registry of their own, `registered_by`), one of them per mutant, drawn with the sample; a
survivor is judged again on every implementation of its file (`judge_everywhere`).  An example of docs/examples/ is
judged as the README checks it, ``--plugin FILE.py:ATTR``.  A mutant is killed when a property fails or hangs on
it; the kill matrix (which properties killed it) is kept.  The selection is a seeded uniform sample per stratum
(impls/<dir>, docs/examples), stated in the run's plan.  An executor is any function that runs a list of
`CheckUnit` and yields their `UnitResult` (`run_here` runs them in this machine's children; a cluster's executor
sends each to a worker that calls `run_here` there).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import re
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from llm_inference_harness.engine import inputs, isolation, outputs, runner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CHECK = re.compile(r"harness check (\w+) --plugin docs/examples/(\w+\.py):(\w+)")
ORIGINAL = "original"  # the operator name of a subject's unmutated text, judged first (its baseline)
# A mutated text that is no valid Python, or that no longer registers the implementation judged (a tile size of its
# name changed): neither killed nor survived -- no property judged it.  In-process (--trusted-in-process) the checking
# process reports it; isolated, the plugin's load does (plugins.LoadFailure), and every property then fails with it.
INVALID = tuple(f"{where}{e}" for where in ("error: the checking process failed: ", "could not be loaded: ")
                for e in ("SyntaxError", "IndentationError", "LookupError: the mutated"))


@dataclass(frozen=True)
class Subject:
    """A file under mutation: what it provides, each as (technique, implementation name or plugin attribute)."""

    path: str  # relative to the repository root
    provides: tuple[tuple[str, str], ...]
    example: bool = False

    @property
    def stratum(self) -> str:
        return str(Path(self.path).parent)


@dataclass(frozen=True)
class Mutation:
    subject: Subject
    operator: str  # cosmic-ray's operator name, or ORIGINAL
    occurrence: int
    judged: tuple[str, str]  # (technique, name) the sample drew among the subject's

    @property
    def id(self) -> str:
        return f"{self.subject.path}:{self.operator}:{self.occurrence}"

    def source(self) -> str | None:
        """The mutated text, or None where the operator changes nothing there."""
        from cosmic_ray.mutating import mutate_code
        from cosmic_ray.plugins import get_operator

        text = (ROOT / self.subject.path).read_text()
        return text if self.operator == ORIGINAL else mutate_code(text, get_operator(self.operator)(), self.occurrence)


def subjects(techniques: Iterable[str] | None = None) -> list[Subject]:
    """The files of impls/ that register an implementation that can run here (mutants excluded), and the example
    plugins of docs/examples/, each with what it provides."""
    from llm_inference_harness.contracts import load_techniques
    from llm_inference_harness.engine.registry import impls

    chosen = set(techniques or load_techniques())
    by_file: dict[str, list[tuple[str, str]]] = {}
    for t in sorted(chosen):
        for impl in impls(t):
            if not impl.unavailable and impl.source.startswith("llm_inference_harness.impls."):
                path = "/".join(impl.source.split(".")[1:]) + ".py"  # the folder impls/ is <top>.impls
                by_file.setdefault(path, []).append((t, impl.name))
    found = [Subject(path, tuple(provides)) for path, provides in sorted(by_file.items())]
    for path in sorted((ROOT / "docs" / "examples").glob("*.py")):
        m = EXAMPLE_CHECK.search(path.read_text())
        if m and m.group(1) in chosen:
            found.append(Subject(f"docs/examples/{m.group(2)}", ((m.group(1), m.group(3)),), example=True))
    return found


def operators() -> list[str]:
    """Every cosmic-ray operator that takes no arguments."""
    from cosmic_ray.plugins import get_operator, operator_names

    return [name for name in operator_names() if not get_operator(name).arguments()]


def mutations_of(subject: Subject) -> list[tuple[str, int, int]]:
    """(operator, occurrence, line) of every mutation cosmic-ray's operators make in the subject."""
    from cosmic_ray.ast import ast_nodes, get_ast
    from cosmic_ray.plugins import get_operator

    nodes = list(ast_nodes(get_ast((ROOT / subject.path).read_text())))
    found = []
    for name in operators():
        op = get_operator(name)()
        positions = [start for node in nodes for start, _ in op.mutation_positions(node)]
        found += [(name, k, start[0]) for k, start in enumerate(positions)]
    return found


def sample(all_subjects: list[Subject], per_stratum: int, seed: int) -> list[Mutation]:
    """A seeded uniform sample of ``per_stratum`` mutations from each stratum's population (all of them where it
    holds fewer), each with the implementation it is judged on, drawn among its file's.  The first ``per_stratum``
    of a seeded shuffle: a larger sample of the same seed holds the smaller one (a run can be extended)."""
    strata: dict[str, list[Mutation]] = {}
    for s in all_subjects:
        for op, k, _ in mutations_of(s):
            judged = random.Random(f"{seed}/{s.path}:{op}:{k}").choice(s.provides)
            strata.setdefault(s.stratum, []).append(Mutation(s, op, k, judged))
    chosen = []
    for stratum, population in sorted(strata.items()):
        random.Random(f"{seed}/{stratum}").shuffle(population)
        chosen += sorted(population[:per_stratum], key=lambda m: (m.subject.path, m.operator, m.occurrence))
    return chosen


def originals(mutations: Iterable[Mutation]) -> list[Mutation]:
    """The unmutated text of each file on each implementation its mutants are judged on: the baseline."""
    pairs = sorted({(m.subject, m.judged) for m in mutations}, key=lambda p: (p[0].path, p[1]))
    return [Mutation(s, ORIGINAL, 0, judged) for s, judged in pairs]


# --- judging -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckUnit:
    """One mutant on one implementation: all a host needs (its checkout of the same commit, and this)."""

    key: str  # the mutation's id and the implementation judged
    technique: str
    path: str  # the subject, relative to the repository root
    name: str  # implementation name, or the example's plugin attribute
    example: bool
    source: str  # the mutated text
    profile: str = "ci"
    limit_s: float = 900.0  # the whole check's limit: a mutant that loops forever is a verdict, not a stall
    properties: tuple[str, ...] = ()  # only these (all when empty)


@dataclass
class UnitResult:
    key: str
    verdicts: list[dict]  # property, status, message (its first line)
    seconds: float
    host: str
    stopped: str = ""


Executor = Callable[[Sequence[CheckUnit]], Iterator[UnitResult]]


def unit_of(mutation: Mutation, source: str, *, profile: str, limit_s: float,
            properties: tuple[str, ...] = ()) -> CheckUnit:
    technique, name = mutation.judged
    return CheckUnit(f"{mutation.id}@{name}", technique, mutation.subject.path, name, mutation.subject.example,
                     source, profile, limit_s, properties)


def run_here(units: Sequence[CheckUnit], *, jobs: int = 1) -> Iterator[UnitResult]:
    """The local executor: the units of one technique and limit at a time, ``jobs`` checking children at once, each
    unit's mutated text written to a temporary folder and checked as a plugin
    (`llm_inference_harness.engine.runner.check`)."""
    groups: dict[tuple, list[CheckUnit]] = {}
    for u in units:
        groups.setdefault((u.technique, u.profile, u.limit_s, u.properties), []).append(u)
    for (technique, profile, limit_s, properties), group in groups.items():
        for start in range(0, len(group), max(2 * jobs, 1)):  # results come back a chunk at a time (resumable)
            yield from _check_chunk(technique, profile, limit_s, properties, group[start:start + max(2 * jobs, 1)],
                                    jobs)


def _check_chunk(technique, profile, limit_s, properties, chunk, jobs) -> Iterator[UnitResult]:
    with tempfile.TemporaryDirectory(prefix="harness-mutants-") as folder:
        targets = [runner.Target(technique, plugin=_plugin_file(Path(folder) / f"u{i}", u)) for i, u in
                   enumerate(chunk)]
        started = time.perf_counter()
        results = runner.check(technique, targets, profile=profile, properties=list(properties) or None, jobs=jobs,
                               shrink=False,
                               limits=isolation.Limits(total_s=limit_s, start_s=runner.import_limit_s()))
        seconds = (time.perf_counter() - started) * min(jobs, len(chunk)) / len(chunk)  # core-seconds per unit
    for u, r in zip(chunk, results, strict=True):
        yield UnitResult(u.key, [{"property": v.property, "status": v.status, "message": v.message.split("\n")[0]}
                                 for v in r.verdicts], round(seconds, 2), socket.gethostname(), r.stopped)


def _plugin_file(folder: Path, unit: CheckUnit) -> str:
    """A plugin spec for the unit: the mutated example itself, or a module whose IMPL is the registration the mutated
    file makes under ``unit.name``."""
    folder.mkdir()
    mutated = folder / Path(unit.path).name
    mutated.write_text(unit.source)
    if unit.example:
        return f"{mutated}:{unit.name}"
    shim = folder / "mutant_plugin.py"
    shim.write_text("from llm_inference_harness.engine.mutation import registered_by\n\n"
                    f"IMPL = registered_by({str(mutated)!r}, {unit.path!r}, {unit.technique!r}, {unit.name!r})\n")
    return f"{shim}:IMPL"


def registered_by(mutated: str, original: str, technique: str, name: str):
    """The record that the module at ``mutated`` registers as (technique, name), run as if it were the file at
    ``original`` (its ``__file__``: resources next to it resolve) into a registry of its own, so neither the real
    registrations nor the mutant's collide."""
    from llm_inference_harness.engine import registry

    registry.load_all()
    real, registry.REGISTRY = registry.REGISTRY, {}
    try:
        digest = hashlib.sha1(mutated.encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(f"harness_mutant_{digest}", ROOT / original)
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
        # dont_inherit: this module's `from __future__ import annotations` must not reach the mutated code, whose
        # annotations run where they are defined, as on import
        exec(compile(Path(mutated).read_text(), str(ROOT / original), "exec", dont_inherit=True), module.__dict__)
        made = registry.REGISTRY
    finally:
        registry.REGISTRY = real
    if (technique, name) not in made:
        raise LookupError(f"the mutated {original} registers no {technique} implementation {name!r} "
                          f"(it registers {sorted(n for _, n in made)})")
    return made[(technique, name)]


# --- a run ---------------------------------------------------------------------------------------------------------
def judge(mutations: Sequence[Mutation], out: Path, *, profile: str = "ci", executor: Executor | None = None,
          jobs: int = 1, limit_factor: float = 4.0, properties: tuple[str, ...] = (),
          log: Callable[[str], None] = print) -> list[dict]:
    """Judge each mutation not yet in ``out``/results.jsonl (a run resumes where it stopped), its subject's original
    first: the whole check's limit for a mutant is ``limit_factor`` times its original's time plus a minute.  Each
    record: the mutation, the mutated line before and after, the verdicts."""
    from llm_inference_harness.engine.profiles import load

    load(profile)  # before a property module is imported: a test's settings are fixed at its import
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    done = {r["key"]: r for r in read_results(path)}
    executor = executor or (lambda units: run_here(units, jobs=jobs))
    for batch in (originals(mutations), list(mutations)):
        baseline = {r["path"]: r["seconds"] for r in done.values() if r["operator"] == ORIGINAL}
        broken = failing_originals(done.values())
        units, records = [], {}
        for m in batch:
            text = m.source()
            record = {"id": m.id, "path": m.subject.path, "operator": m.operator, "occurrence": m.occurrence,
                      "technique": m.judged[0], "impl": m.judged[1], **changed_line(m.subject.path, text)}
            limit = limit_factor * baseline.get(m.subject.path, 60.0) + 60.0
            unit = unit_of(m, text or "", profile=profile, limit_s=round(limit), properties=properties)
            if unit.key in done:
                continue
            if text is None or text == (ROOT / m.subject.path).read_text() and m.operator != ORIGINAL or not (
                    compiles(text)):  # cosmic-ray turns the keyword-only marker * of a signature into & or |
                done[unit.key] = _append(path, {**record, "key": unit.key, "outcome": "incompetent", "verdicts": [],
                                                "seconds": 0.0})
                continue
            units.append(unit)
            records[unit.key] = record
        started = time.perf_counter()
        for k, result in enumerate(executor(units), 1):
            record = {**records[result.key], **asdict(result)}
            record["outcome"] = outcome(record, broken.get((record["path"], record["impl"]), set()))
            done[result.key] = _append(path, record)
            rate = k / (time.perf_counter() - started) * 60
            log(f"[{k}/{len(units)}] {record['outcome']:<9} {result.key} ({result.seconds:.0f} s, {rate:.2f}/min)")
    return list(done.values())


def compiles(text: str) -> bool:
    try:
        compile(text, "<mutant>", "exec", dont_inherit=True)
    except SyntaxError:
        return False
    return True


def changed_line(path: str, text: str | None) -> dict:
    """The first line the mutation changed, before and after (what the triage file names a mutant by)."""
    before = (ROOT / path).read_text().splitlines()
    after = (text or "").splitlines()
    for i, (a, b) in enumerate(zip(before, after, strict=False)):
        if a != b:
            return {"line": i + 1, "before": a.strip(), "after": b.strip()}
    return {"line": 0, "before": "", "after": ""}


def failing_originals(records: Iterable[dict]) -> dict[tuple[str, str], set[str]]:
    """(path, implementation) -> the properties its unmutated text fails: no evidence against a mutant of it (over
    all its records: `confirm` judges an original a few properties at a time)."""
    broken: dict[tuple[str, str], set[str]] = {}
    for r in records:
        if r["operator"] == ORIGINAL:
            broken.setdefault((r["path"], r["impl"]), set()).update(
                v["property"] for v in r["verdicts"] if v["status"] in ("FAIL", "stale"))
    return broken


def outcome(record: dict, broken: set[str] = frozenset()) -> str:
    """killed (a property its original passes failed or hung), survived, skipped (every property skipped: it cannot
    run here), or incompetent (INVALID: no evidence either way)."""
    if any(v["message"].startswith(INVALID) for v in record["verdicts"]):
        return "incompetent"
    statuses = {v["status"] for v in record["verdicts"] if v["property"] not in broken}
    if statuses & {"FAIL", "stale"}:
        return "killed"
    return "survived" if statuses - {"skip"} else "skipped"


def read_results(path: Path) -> list[dict]:
    """The records of an append-only log (results.jsonl, runs.jsonl), one JSON object a line.  A record is whole
    once its newline is written (`_append`): a last line without one -- a run killed mid-append -- is left out (its
    unit is judged again on resume); any other line that is not a record is a BadFile naming the file and line."""
    if not path.exists():
        return []
    *whole, _torn = path.read_text().split("\n")
    records = []
    for n, line in enumerate(whole, 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise inputs.BadFile(path, f"line {n} is not a JSON record ({exc.msg})") from None
    return records


def _append(path: Path, record: dict) -> dict:
    """One record, one line, in one write; a torn last line that a killed run left is cut off first, so that a
    record never follows one cut short on its line."""
    line = (json.dumps(record) + "\n").encode()
    with path.open("ab+") as f:
        end = f.seek(0, 2)
        if end and (f.seek(end - 1), f.read(1))[1] != b"\n":
            f.seek(0)
            f.truncate(f.read().rfind(b"\n") + 1)
        f.write(line)
    return record


def everywhere(records: Iterable[dict], all_subjects: list[Subject]) -> list[Mutation]:
    """Each survivor again, on every other implementation its file provides: killed there, it is killed."""
    by_path = {s.path: s for s in all_subjects}
    records = list(records)
    judged = {(r["id"], r["impl"]) for r in records}
    again = []
    for r in records:
        if r["outcome"] == "survived" and r["path"] in by_path:
            s = by_path[r["path"]]
            again += [Mutation(s, r["operator"], r["occurrence"], p) for p in s.provides
                      if (r["id"], p[1]) not in judged]
    return again


# --- scores --------------------------------------------------------------------------------------------------------
BAD_INPUT = "bad_input"  # in a property's name: it checks that bad arguments are rejected, nothing of the algorithm
BROKE = ("crashed:", "hung:", "not run:", "error:", "stopped:")  # the property failed because the mutant did


def triage(path: Path) -> list[dict]:
    """The committed triage of survivors: entries naming a mutant by file and changed line (before, after)."""
    import tomllib

    return tomllib.loads(path.read_text()).get("survivor", []) if path.exists() else []


def summarize(records: Iterable[dict], triaged: list[dict]) -> dict:
    """Per mutant (all its units): killed or not, by which properties; per technique and per implementation: judged,
    killed, survivors, equivalent (triaged), and the score killed / (judged - equivalent)."""
    broken = failing_originals(records := list(records))
    mutants: dict[str, dict] = {}
    for r in records:
        if r["operator"] == ORIGINAL or r["outcome"] in ("incompetent", "skipped") or outcome(r) == "incompetent":
            continue
        m = mutants.setdefault(r["id"], {k: r[k] for k in ("id", "path", "operator", "line", "before", "after",
                                                            "technique")} | {"impls": [], "killers": {}})
        m["impls"].append(r["impl"])
        for v in r["verdicts"]:
            if v["status"] in ("FAIL", "stale") and v["property"] not in broken.get((r["path"], r["impl"]), ()):
                m["killers"][v["property"]] = "broke" if v["message"].startswith(BROKE) or (
                    "ContractViolation: raised " in v["message"]) else "computed"
    for m in mutants.values():
        entry = next((t for t in triaged if (t["path"], t["before"], t["after"]) == (m["path"], m["before"],
                                                                                    m["after"])), None)
        m["triage"] = entry["verdict"] if entry else ""
        m["status"] = "killed" if m["killers"] else "equivalent" if m["triage"] == "equivalent" else "survived"
    return {"mutants": mutants, "broken": {f"{p}@{i}": sorted(v) for (p, i), v in broken.items()},
            "techniques": _scores(mutants.values(), lambda m: m["technique"]),
            "files": _scores(mutants.values(), lambda m: m["path"])}


def _scores(mutants: Iterable[dict], key: Callable[[dict], str]) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for m in mutants:
        row = rows.setdefault(key(m), {"judged": 0, "killed": 0, "equivalent": 0, "survived": 0})
        row["judged"] += 1
        row[m["status"]] += 1
    for row in rows.values():
        live = row["judged"] - row["equivalent"]
        row["score"] = round(row["killed"] / live, 4) if live else None
    return dict(sorted(rows.items()))


def kill_quality(mutants: Iterable[dict]) -> dict[str, list[dict]]:
    """Killed mutants whose kill says little: only by a bad-input property, on valid inputs only by crashing or
    hanging, or by one property on valid inputs (the goal is two independent properties per semantic mutant)."""
    weak: dict[str, list[dict]] = {"bad input only": [], "crash or hang only": [], "one property": []}
    for m in mutants:
        semantic = [p for p in m["killers"] if BAD_INPUT not in p]
        if m["killers"] and not semantic:
            weak["bad input only"].append(m)
        elif semantic and all(m["killers"][p] == "broke" for p in semantic):
            weak["crash or hang only"].append(m)
        elif len(semantic) == 1:
            weak["one property"].append(m)
    return weak


def report(summary: dict, *, title: str, seconds: float | None = None, units: int | None = None) -> str:
    """The run's scores, survivors and weak kills as markdown."""
    lines = [f"# {title}", "", "| technique | judged | killed | equivalent | survived | score |",
             "|---|---|---|---|---|---|"]
    for name, row in summary["techniques"].items():
        score = f"{100 * row['score']:.1f}%" if row["score"] is not None else "-"
        lines.append(f"| {name} | {row['judged']} | {row['killed']} | {row['equivalent']} | {row['survived']} | "
                     f"{score} |")
    lines += ["", "| file | judged | killed | equivalent | survived |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {r['judged']} | {r['killed']} | {r['equivalent']} | {r['survived']} |"
              for name, r in summary["files"].items()]
    if seconds and units:
        lines += ["", f"{units} checks in {seconds / 60:.1f} min: {units / seconds * 60:.2f} mutants per minute."]
    broken = {k: v for k, v in summary["broken"].items() if v}
    if broken:
        lines += ["", "Properties the unmutated files fail (no evidence against their mutants): "
                  + "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in broken.items())]
    for status in ("survived", "equivalent"):
        rows = [m for m in summary["mutants"].values() if m["status"] == status]
        lines += ["", f"## {status} ({len(rows)})", ""]
        lines += [f"- `{m['id']}` line {m['line']}: `{m['before']}` -> `{m['after']}` ({', '.join(m['impls'])})"
                  for m in rows]
    for kind, rows in kill_quality(summary["mutants"].values()).items():
        lines += ["", f"## killed by {kind} ({len(rows)})", ""]
        lines += [f"- `{m['id']}` `{m['before']}` -> `{m['after']}`: {', '.join(m['killers'])}" for m in rows]
    return "\n".join(lines) + "\n"


TRIAGE = ROOT / "docs" / "mutation-triage.toml"
GOAL = 0.95  # of the non-equivalent mutants of each technique, killed in the ci profile


def planned(path: Path, all_subjects: list[Subject]) -> list[Mutation]:
    """The mutations of an earlier run's plan.json (to judge the same mutants again after a fix)."""
    by_path = {s.path: s for s in all_subjects}
    chosen = []
    plan = inputs.read_json(path, "a machine-made mutants run's plan.json")
    inputs.require(path, plan, {"mutations": list})
    for key in plan["mutations"]:
        mutation, name = key.rsplit("@", 1)
        file, op, k = mutation.rsplit(":", 2)
        # a file providing several techniques (torchao_affine.py) is judged here only on those asked for
        judged = next((p for p in by_path[file].provides if p[1] == name), None) if file in by_path else None
        if judged:
            chosen.append(Mutation(by_path[file], op, int(k), judged))
    return chosen


def run(out: Path, *, techniques: list[str] | None = None, per_stratum: int = 40, seed: int = 0, profile: str = "ci",
        jobs: int = 1, plan: Path | None = None, executor: Executor | None = None,
        log: Callable[[str], None] = print) -> int:
    """Sample (or take an earlier run's ``plan``), judge (resuming what ``out`` holds), judge the survivors on their
    files' other implementations, and write summary.json and report.md; 0 when every technique reaches GOAL."""
    all_subjects = subjects(techniques)
    chosen = planned(plan, all_subjects) if plan else sample(all_subjects, per_stratum, seed)
    out.mkdir(parents=True, exist_ok=True)
    outputs.write_text(out / "plan.json", json.dumps({"seed": seed, "per_stratum": per_stratum, "profile": profile,
                                               "from": str(plan or ""),
                                               "mutations": [m.id + "@" + m.judged[1] for m in chosen]}, indent=1))
    started, before = time.perf_counter(), len(read_results(out / "results.jsonl"))
    records = judge(chosen, out, profile=profile, executor=executor, jobs=jobs, log=log)
    records = judge(everywhere(records, all_subjects), out, profile=profile, executor=executor, jobs=jobs, log=log)
    title = f"the mutants of {plan}" if plan else f"{per_stratum} per folder, seed {seed}"
    summary = _written(out, records, len(records) - before, started, jobs=jobs, profile=profile,
                       title=f"Machine-made mutants: {title}, profile {profile}", log=log)
    return 0 if all(r["score"] is None or r["score"] >= GOAL for r in summary["techniques"].values()) else 1


def _written(out: Path, records: list[dict], units: int, started: float, *, jobs: int, profile: str, title: str,
             log: Callable[[str], None]) -> dict:
    """A run's line in runs.jsonl (if it judged ``units`` > 0), then its summary.json and report.md; the summary."""
    from llm_inference_harness.engine import provenance

    if units > 0:
        _append(out / "runs.jsonl", {"seconds": round(time.perf_counter() - started, 1), "units": units,
                                     "jobs": jobs, **provenance.run_info(profile)})
    summary = summarize(records, triage(TRIAGE))
    runs = read_results(out / "runs.jsonl")
    outputs.write_text(out / "summary.json", json.dumps(summary, indent=1))
    text = report(summary, title=title, seconds=sum(r["seconds"] for r in runs), units=sum(r["units"] for r in runs))
    outputs.write_text(out / "report.md", text)
    log(text)
    return summary


# --- the same kills in a stronger profile ------------------------------------------------------------------------
def earlier_kills(prior: Iterable[dict]) -> list[tuple[dict, list[str]]]:
    """One record per mutant an earlier run killed (a later record of a unit replaces an earlier one: a run judged
    again after a fix), each with the properties that killed it."""
    latest = {r["key"]: r for r in prior}
    broken = failing_originals(latest.values())
    kills: dict[str, tuple[dict, list[str]]] = {}
    for r in latest.values():
        bad = broken.get((r["path"], r["impl"]), set())
        if r["operator"] != ORIGINAL and r["id"] not in kills and outcome(r, bad) == "killed":
            kills[r["id"]] = (r, [v["property"] for v in r["verdicts"]
                                  if v["status"] in ("FAIL", "stale") and v["property"] not in bad])
    return list(kills.values())


def cover_order(killers: Iterable[Iterable[str]]) -> list[str]:
    """The properties a greedy set cover takes, in order: each next one kills the most mutants no earlier one
    kills (ties by name)."""
    left, order = [set(k) for k in killers], []
    while any(left):
        best = max(sorted({p for k in left for p in k}), key=lambda p: sum(p in k for k in left))
        order.append(best)
        left = [k for k in left if best not in k]
    return order


ALL = "all"  # a unit of every property (the key's suffix)
ORIGINAL_LIMIT_S = 3600.0  # an unmutated file's check: a few properties of a profile of many examples


def confirm(prior: Iterable[dict], out: Path, *, profile: str = "thorough", techniques: Iterable[str] | None = None,
            executor: Executor | None = None, jobs: int = 1, limit_factor: float = 4.0,
            log: Callable[[str], None] = print) -> list[dict]:
    """Judge again in ``profile`` each mutant an earlier run killed (`earlier_kills`), a property at a time: its
    earlier killers, in the order that covers its file's mutants with the fewest properties (`cover_order`), each
    judged first on the unmutated file (a property the original fails in this profile is no evidence).  Killed at
    the first that its original passes and it fails; one that none of them kills is judged on every property.  A
    property that passes runs every example, so in a profile of many examples this costs each original a few
    properties, not each mutant every property.  Resumes what ``out`` holds; returns its records."""
    from llm_inference_harness.engine.profiles import load

    load(profile)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    done = {r["key"]: r for r in read_results(path)}
    executor = executor or (lambda units: run_here(units, jobs=jobs))
    todo = _confirmable(earlier_kills(prior), set(techniques) if techniques else None)
    while True:
        originals_needed: dict[Mutation, set[str]] = {}
        mutants_needed: list[tuple[Mutation, str, str]] = []
        for m, text, candidates in todo:
            kind, prop = _next_step(m, candidates, done)
            if kind == "original":
                originals_needed.setdefault(Mutation(m.subject, ORIGINAL, 0, m.judged), set()).add(prop)
            elif kind == "mutant":
                mutants_needed.append((m, text, prop))
        if not originals_needed and not mutants_needed:
            return list(done.values())
        if originals_needed:  # first: a property its original fails is no evidence, and it sets the mutant's limit
            needed = [(o, o.source() or "", props, ORIGINAL_LIMIT_S) for o, props in originals_needed.items()]
        else:
            needed = [(m, text, {prop}, limit_factor * _original_seconds(m, prop, done) + 60.0)
                      for m, text, prop in mutants_needed]
        _judge_units({_unit(m, text, profile, props, limit): (m, text) for m, text, props, limit in needed}, executor,
                     done, path, log)


def _confirmable(kills: list[tuple[dict, list[str]]],
                 techniques: set[str] | None) -> list[tuple[Mutation, str, list[str]]]:
    """Each earlier kill as a mutation of the file as it is now, with its text and its killers in its file's cover
    order.  A UsageError where a file changed since (the mutation now changes another line): that kill cannot be
    confirmed, and leaving it out would raise the score."""
    kills = [(r, k) for r, k in kills if techniques is None or r["technique"] in techniques]
    by_path = {s.path: s for s in subjects({r["technique"] for r, _ in kills})}
    orders = {key: cover_order(k for r, k in kills if (r["path"], r["impl"]) == key)
              for key in {(r["path"], r["impl"]) for r, _ in kills}}
    todo = []
    for r, killers in kills:
        m = Mutation(by_path[r["path"]], r["operator"], r["occurrence"], (r["technique"], r["impl"]))
        text = m.source() or ""
        if {k: changed_line(r["path"], text)[k] for k in ("before", "after")} != {
                "before": r["before"], "after": r["after"]}:
            raise inputs.UsageError(f"--confirm: {m.id} no longer changes `{r['before']}` into `{r['after']}`: "
                                    f"{r['path']} changed since those results; judge its mutants again first")
        order = orders[(r["path"], r["impl"])]
        todo.append((m, text, sorted(killers, key=lambda p: (order.index(p) if p in order else len(order), p))))
    return todo


def _next_step(m: Mutation, candidates: list[str], done: dict) -> tuple[str, str]:
    """What ``m`` waits for: ("original", property), ("mutant", property), or ("decided", "")."""
    name = m.judged[1]
    verdicts: dict[str, str] = {}  # property -> its status on the original, in this profile
    for r in done.values():
        if r["operator"] == ORIGINAL and (r["path"], r["impl"]) == (m.subject.path, name):
            verdicts.update((v["property"], v["status"]) for v in r["verdicts"])
    for prop in candidates:
        if prop not in verdicts:
            return "original", prop
        if verdicts[prop] != "pass":
            continue
        record = done.get(f"{m.id}@{name}#{prop}")
        if record is None:
            return "mutant", prop
        if record["outcome"] == "killed":
            return "decided", ""
    if not any(k.startswith(f"{m.subject.path}:{ORIGINAL}:0@{name}#") and k.endswith(f"#{ALL}") for k in done):
        return "original", ALL
    return ("decided", "") if f"{m.id}@{name}#{ALL}" in done else ("mutant", ALL)


def _unit(m: Mutation, text: str, profile: str, props: set[str], limit_s: float) -> CheckUnit:
    properties = () if ALL in props else tuple(sorted(props))
    unit = unit_of(m, text, profile=profile, limit_s=round(limit_s), properties=properties)
    return replace(unit, key=f"{unit.key}#{'+'.join(properties) or ALL}")


def _original_seconds(m: Mutation, prop: str, done: dict) -> float:
    """The time of the original's unit that judged ``prop`` (a few properties: a generous bound for one)."""
    prefix = f"{m.subject.path}:{ORIGINAL}:0@{m.judged[1]}#"
    return max((r["seconds"] for k, r in done.items() if k.startswith(prefix) and (
        prop == ALL and k.endswith(f"#{ALL}") or any(v["property"] == prop for v in r["verdicts"]))), default=60.0)


def _judge_units(units: dict[CheckUnit, tuple[Mutation, str]], executor: Executor, done: dict, path: Path,
                 log: Callable[[str], None]) -> None:
    """Judge ``units`` (each {unit: (its mutation, its text)}), appending each record to ``path`` and ``done``."""
    broken = failing_originals(done.values())
    by_key = {u.key: judged for u, judged in units.items()}
    started = time.perf_counter()
    for k, result in enumerate(executor(list(units)), 1):
        m, text = by_key[result.key]
        record = {"id": m.id, "path": m.subject.path, "operator": m.operator, "occurrence": m.occurrence,
                  "technique": m.judged[0], "impl": m.judged[1], **changed_line(m.subject.path, text),
                  **asdict(result)}
        record["outcome"] = outcome(record, broken.get((record["path"], record["impl"]), set()))
        done[result.key] = _append(path, record)
        rate = k / (time.perf_counter() - started) * 60
        log(f"[{k}/{len(units)}] {record['outcome']:<9} {result.key} ({result.seconds:.0f} s, {rate:.2f}/min)")


def run_confirm(out: Path, prior: list[Path], *, techniques: list[str] | None = None, profile: str = "thorough",
                jobs: int = 1, executor: Executor | None = None, log: Callable[[str], None] = print) -> int:
    """`confirm` the kills recorded in ``prior`` (results.jsonl files, later ones replacing earlier records of a
    unit), then write summary.json and report.md; 0 when every one of them is killed again."""
    records = [r for p in prior for r in read_results(p)]
    if not records:
        raise inputs.BadFile(prior[0] if prior else out, "holds no results: nothing to confirm")
    started, before = time.perf_counter(), len(read_results(out / "results.jsonl"))
    records = confirm(records, out, profile=profile, techniques=techniques, executor=executor, jobs=jobs, log=log)
    summary = _written(out, records, len(records) - before, started, jobs=jobs, profile=profile,
                       title=f"The kills of {', '.join(map(str, prior))} judged again, profile {profile}", log=log)
    return 0 if all(row["survived"] == 0 for row in summary["techniques"].values()) else 1
