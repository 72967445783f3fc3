"""Command line: ``harness list | check | mutants | run | compare | gate | report``.

The checking itself is llm_inference_harness.engine.runner's: each implementation runs in its own child process, so
whatever a plugin does becomes a verdict and the run goes on.  This module parses arguments, prints progress and the
implementation x property matrix, and writes the JSON documents (schema: docs/verdicts.md).

Exit codes: 0 everything that should pass passed, 1 a property failed (or a mutant survived, or a plugin's own
code could not be loaded), 2 a usage error (unknown technique, implementation, property or plugin attribute, bad
plugin path, bad flag, an output path that cannot be written, a file read back that is not what it should be),
130 interrupted.  Every argument is validated (`validate`) before any work starts.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import NoReturn

from llm_inference_harness.contracts import load_techniques
from llm_inference_harness.engine import environment, outputs, profiles, provenance, runner
from llm_inference_harness.engine import scale as scale_out
from llm_inference_harness.engine.inputs import VERDICTS_SCHEMA, UsageError
from llm_inference_harness.engine.registry import (
    DISTRIBUTION,
    ENTRY_POINT_GROUP,
    enable_entry_points,
    impls,
)
from llm_inference_harness.engine.terminal import Printer, mutant_score, print_matrix, print_score, report_load_errors

SCHEMA = VERDICTS_SCHEMA
FAILING = ("FAIL", "stale")  # statuses that make a check exit 1 (an upstream failure is recorded, not failing)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    saved = dict(os.environ)  # what this command sets for its children (trust, the example database) ends with
    try:                      # it: main() called in a test leaves the next command as it found it
        return _command(args)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _command(args: argparse.Namespace) -> int:
    if getattr(args, "trusted_in_process", False):
        os.environ[runner.TRUSTED_IN_PROCESS] = "1"
    try:
        validate(args)
        if getattr(args, "entry_points", None):
            enable_entry_points(args.entry_points.split(","))
        return args.func(args)
    except UsageError as exc:  # a bad argument, output path or file read back (OutputError, BadFile)
        print(f"harness {args.command}: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: every checking process was stopped; no verdict file was written", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # now: tearing down torch and Hypothesis takes seconds, and nothing is left to save
    except BrokenPipeError:  # `list | head`: the reader left; end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


class _Parser(argparse.ArgumentParser):
    """argparse's own errors (an unknown flag, a missing or mistyped value) as one line, like the harness's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {_one_line(message)} (`{self.prog} --help` shows the usage)\n")


def _one_line(message: str) -> str:
    """A message on one line, whatever the value it quotes holds (a newline in a path is shown as \\n)."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="harness", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    ls = sub.add_parser("list", help="techniques, implementations, capabilities, mutants")
    ls.add_argument("technique", nargs="?")
    ls.add_argument("--caps", action="store_true", help="the table of capabilities each technique's implementations "
                                                        "may declare: name, type, default, meaning")
    _entry_points(ls)
    ls.set_defaults(func=cmd_list)

    ck = sub.add_parser("check", help="run every property of a technique against implementations")
    ck.add_argument("technique")
    ck.add_argument("--impl", action="append", default=[], metavar="NAME", help="registered implementation")
    ck.add_argument("--plugin", action="append", default=[], metavar="MODULE:ATTR|FILE.py:ATTR",
                    help="your implementation, imported only in its checking process")
    ck.add_argument("--property", action="append", default=[], metavar="NAME", help="only these properties")
    ck.add_argument("--reproduce", metavar="BLOB", help="replay the failing example a FAIL's reproduce line names")
    ck.add_argument("--no-shrink", dest="shrink", action="store_false",
                    help="report each failure's first example as found, not a minimal one (a faster verdict; its "
                         "reproduce line replays that example)")
    _common(ck)
    ck.set_defaults(func=cmd_check)

    mu = sub.add_parser("mutants", help="run the properties against every mutant; fail if one survives")
    mu.add_argument("technique", nargs="?")
    mu.add_argument("--all-properties", action="store_true", help="run every property against every mutant (the "
                    "whole kill matrix) instead of stopping at the first declared killer that kills it")
    mu.add_argument("--score", action="store_true", help="run every property (as --all-properties), then each "
                    "mutant's declared killers under the thorough profile, and print per technique: mutants killed by "
                    "ci / by thorough, the properties that killed each, the median margin (error / bound of the "
                    "killing case)")
    mu.add_argument("--machine-made", metavar="DIR", help="instead: cosmic-ray's mutants of impls/ and the example "
                    "plugins, a seeded sample per folder, each judged by its technique's check; results (resumable), "
                    "summary.json and report.md under DIR; exit 1 if a technique kills under 95%% of them")
    mu.add_argument("--sample", type=int, default=40, metavar="N", help="--machine-made: mutants per folder")
    mu.add_argument("--seed", type=int, default=0, help="--machine-made: the sample's seed")
    mu.add_argument("--plan", metavar="FILE", help="--machine-made: judge the mutants of an earlier run's plan.json "
                    "(the same mutants again, after a fix)")
    mu.add_argument("--confirm", action="append", default=[], metavar="RESULTS", help="--machine-made: judge "
                    "again, in --profile, every mutant these results.jsonl files record killed, its earlier killers "
                    "first and its original on each property first (later files replace earlier records)")
    _common(mu)
    mu.set_defaults(func=cmd_mutants)

    run = sub.add_parser("run", help="the main job: check everything, kill every mutant, quick benchmarks, report")
    run.add_argument("technique", nargs="*", help="only these techniques' checks and mutants (default: all)")
    _common(run, json=False)
    run.add_argument("--no-bench", action="store_true", help="skip the quick benchmark pass")
    run.add_argument("--no-report", action="store_true", help="skip writing the report")
    run.set_defaults(func=cmd_run)

    from llm_inference_harness.bench import compare

    cmp = sub.add_parser("compare", help="A/B: HEAD / BASE per benchmark case in interleaved rounds, with a 99%% "
                                         "interval and a verdict (or two implementations: --impls A B)")
    compare.add_arguments(cmp)
    cmp.set_defaults(func=compare.run)

    gate = sub.add_parser("gate", help="regression gate: HEAD against BASE, interleaved A/B rounds")
    gate.add_argument("base")
    gate.add_argument("head", nargs="?", default="HEAD")
    gate.add_argument("--bench", metavar="REGEX", help="only benchmarks matching REGEX")
    gate.set_defaults(func=cmd_gate)

    rep = sub.add_parser("report", help="write the report (Markdown + PNG plots measured here)")
    rep.add_argument("--only", action="append", metavar="SECTION", help="only sections whose title contains this")
    rep.add_argument("--out", metavar="DIR", help="where to write it (default: <results>/report)")
    rep.add_argument("--quick", action="store_true", help="leave out the sections with sweeps of their own (as "
                     "`run` does), keeping those a previous report measured")
    rep.set_defaults(func=cmd_report)

    from llm_inference_harness.engine import merge

    mg = sub.add_parser("merge", help="join the verdicts documents of a run's shards into one (docs/scale.md)")
    merge.add_arguments(mg)
    mg.set_defaults(func=merge.run, failing=FAILING)
    return p


def _entry_points(p: argparse.ArgumentParser) -> None:
    p.add_argument("--entry-points", metavar="NAMES", help="also load these entry points of other installed "
                   "distributions (comma-separated, or 'all'); each is first imported in a throwaway process")


def _common(p: argparse.ArgumentParser, json: bool = True) -> None:
    p.add_argument("--profile", default="ci", choices=profiles.PROFILES, help="Hypothesis profile (default ci)")
    if json:
        p.add_argument("--json", metavar="FILE", help="also write the verdicts as JSON ('-': to stdout)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="checking processes at once (check: an implementation's properties may be shared among them)")
    p.add_argument("-v", "--verbose", action="store_true", help="a line per finished (implementation, property) and "
                   "per mutant, every skip's property and reason, and (run) each technique's matrix")
    p.add_argument("--trusted-in-process", action="store_true",
                   help="run the implementation inside the judge's own process: only for code you trust (a plugin "
                        "there can change its own verdicts; by default it runs in a process of its own)")
    _entry_points(p)
    scale_out.add_arguments(p)


def _scale(args) -> scale_out.Scale:
    try:
        return scale_out.Scale.from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# Validation: every name and path a command was given, checked before any work starts.  One function per concern,
# each a no-op for a command without that argument, so a subcommand added later is checked for the flags it shares.
def validate(args: argparse.Namespace) -> None:
    """UsageError naming the first bad argument and what it expects (compare and gate check their own commits and
    patterns: llm_inference_harness.bench.compare.validate)."""
    for concern in (_environment, _example_db, _profile, _valid_counts, _valid_names, _valid_entry_points,
                    _valid_reproduce, _valid_sections, _valid_outputs):
        concern(args)


def _environment(args: argparse.Namespace) -> None:
    """Every HARNESS_* variable that is set (llm_inference_harness.engine.environment), before anything reads one."""
    environment.check()


def _example_db(args: argparse.Namespace) -> None:
    """--example-db, set (and its server reached) before the profile is loaded: a property module imported to check
    a name builds its @settings from the profile then, database included."""
    if getattr(args, "example_db", None):
        from llm_inference_harness.engine import exampledb

        try:
            exampledb.configure(args.example_db, args.example_db_write)
        except ValueError as exc:
            raise UsageError(str(exc)) from None


def _profile(args: argparse.Namespace) -> None:
    """The Hypothesis profile, loaded before a property module is imported to check a name: @settings read it."""
    if getattr(args, "profile", None) is not None:
        profiles.load(args.profile)


def _valid_counts(args: argparse.Namespace) -> None:
    jobs = getattr(args, "jobs", None)
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs {jobs}: expected a whole number >= 1 (checking processes at once)")


def _valid_names(args: argparse.Namespace) -> None:
    """The technique, implementations, properties and plugin specs: known (a plugin: findable without importing
    it), else a usage error listing the known ones."""
    technique = getattr(args, "technique", None)
    for name in technique if isinstance(technique, list) else []:  # run's techniques
        _known_technique(name)
    if isinstance(technique, list):
        technique = None
    if technique is not None:
        _known_technique(technique)
    given = {flag: getattr(args, flag, None) or [] for flag in ("impl", "plugin", "property")}
    for flag, names in given.items():
        if any(not name.strip() for name in names):
            raise UsageError(f"--{flag}: an empty name" + (f"; `harness list {technique}` shows the "
                                                           "implementations" if flag == "impl" else ""))
    if technique is not None:
        _targets(technique, given["impl"], given["plugin"])
        _properties(technique, given["property"])


def _valid_entry_points(args: argparse.Namespace) -> None:
    """--entry-points (and HARNESS_ENTRY_POINTS): names or values of installed entry points, or 'all'."""
    given = [("--entry-points", (getattr(args, "entry_points", None) or "").split(",")),
             ("HARNESS_ENTRY_POINTS", environment.value("HARNESS_ENTRY_POINTS"))]
    given = [(where, [name for name in names if name]) for where, names in given]
    if not any(names for _, names in given):
        return
    from importlib.metadata import entry_points

    theirs = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.dist is None or ep.dist.name != DISTRIBUTION]
    known = {ep.name for ep in theirs} | {ep.value for ep in theirs} | {"all"}
    for where, names in given:
        unknown = [name for name in names if name not in known]
        if unknown:
            installed = ", ".join(sorted(ep.name for ep in theirs)) or "none is installed"
            raise UsageError(f"{where}: no entry point {', '.join(map(repr, unknown))} of another distribution in "
                             f"group {ENTRY_POINT_GROUP} (installed: {installed}; 'all' loads every one)")


def _valid_reproduce(args: argparse.Namespace) -> None:
    """--reproduce VERSION:BLOB as a FAIL's reproduce line prints it, of this Hypothesis, for one property."""
    blob = getattr(args, "reproduce", None)
    if blob is None:
        return
    import base64
    import binascii

    import hypothesis

    version, _, data = blob.partition(":")
    try:
        base64.b64decode(data, validate=True)
        well_formed = bool(re.fullmatch(r"\d+(\.\d+)+", version) and data)
    except binascii.Error:
        well_formed = False
    if not well_formed:
        raise UsageError(f"--reproduce {blob!r}: expected VERSION:BLOB as a FAIL's reproduce line prints it "
                         f"(e.g. {hypothesis.__version__}:AXicY2BkYGAAAAAJAAM=)")
    if version != hypothesis.__version__:
        raise UsageError(f"--reproduce: the example was recorded by Hypothesis {version} and this is "
                         f"{hypothesis.__version__}, which cannot replay it: install {version}, or run without it")
    if len(args.property) != 1:
        raise UsageError("--reproduce replays one property's example: name that property with --property, as the "
                         "reproduce line does")


def _valid_sections(args: argparse.Namespace) -> None:
    only = getattr(args, "only", None) or []
    if not only:
        return
    from llm_inference_harness.bench.report import section_titles

    titles = section_titles()
    for part in only:
        if not part.strip() or not any(part.lower() in title.lower() for title in titles):
            raise UsageError(f"--only {part!r}: no section's title contains it; the sections: {'; '.join(titles)}")


def _valid_outputs(args: argparse.Namespace) -> None:
    """Every path the command will write, checked now rather than when a long run ends
    (llm_inference_harness.engine.outputs)."""
    _valid_json_path(getattr(args, "json", None))
    if getattr(args, "machine_made", None) is not None:
        outputs.check_folder(args.machine_made, "--machine-made")
    if args.command == "run":
        _valid_results_folder()
    if args.command == "report":
        if args.out is not None:
            outputs.check_folder(args.out, "--out")
        else:
            _valid_results_folder()


def _valid_results_folder() -> None:
    if os.environ.get("HARNESS_OUT"):
        outputs.check_folder(provenance.output_root(), "HARNESS_OUT")
    else:
        outputs.check_folder(provenance.output_root(), "the results folder", parents=True)


# ---------------------------------------------------------------------------------------------
def cmd_list(args) -> int:
    techniques = load_techniques()
    names = [args.technique] if args.technique else sorted(techniques)
    for name in names:
        _known_technique(name)
        t = techniques[name]
        print(f"{t.name}: {t.summary}\n  contract: {t.signature}")
        if args.caps:
            rows = t.caps.table()
            width = max(len(r[0]) for r in rows)
            print(f"  capabilities ({t.caps.__name__}, declared as caps={{...}}):")
            for cap, kind, default, meaning in rows:
                print(f"    {cap:<{width}}  {kind}  (default {default})\n    {'':<{width}}  {meaning}")
        for r in impls(name, mutants=None):
            kind = f"MUTANT ({r.bug}; killed by {', '.join(r.killed_by)})" if r.mutant else (
                "exact" if r.exact else "approximate")
            if r.unavailable:
                kind += f"; UNAVAILABLE: {r.unavailable}"
            declared = r.caps.declared()
            print(f"  {r.name:<28} {kind}\n  {'':<28} devices={','.join(r.devices)} dtypes={','.join(r.dtypes)}"
                  + (f" caps={declared}" if declared else "") + (f"\n  {'':<28} {r.cite}" if r.cite else ""))
        print()
    report_load_errors()
    return 0


def cmd_check(args) -> int:
    return check(args.technique, names=args.impl, plugins=args.plugin, properties=args.property,
                 profile=args.profile, jobs=args.jobs, json_path=args.json, reproduce=args.reproduce,
                 shrink=args.shrink, scale=_scale(args), verbose=args.verbose)


def check(technique: str, *, names: list[str], plugins: list[str], properties: list[str], profile: str, jobs: int,
          json_path: str | None, reproduce: str | None = None, shrink: bool = True,
          scale: scale_out.Scale | None = None, verbose: bool = False, matrix: bool = True) -> int:
    """``matrix=False`` (`harness run`): a summary line in place of the matrix, unless ``verbose``."""
    profiles.load(profile)
    _known_technique(technique)
    targets = _targets(technique, names, plugins)
    props = _properties(technique, properties)
    _valid_json_path(json_path)
    out = sys.stderr if json_path == "-" else sys.stdout
    started = time.perf_counter()
    scale = scale or scale_out.Scale()
    plan = scale.plan_check(technique, targets, [p.name for p in props])
    with Printer(technique, len(plan.units), out, verbose=verbose) as printer:
        results = scale.check(technique, plan, profile=profile, properties=properties, jobs=jobs, progress=printer,
                              blob=reproduce, shrink=shrink)
    _unique_names(results)
    print_matrix(technique, results, props, out, detail=verbose, matrix=matrix or verbose)
    _write_json(json_path, scale.annotate(verdicts_document(technique, profile, results,
                                                            time.perf_counter() - started), plan))
    report_load_errors()
    return 1 if any(v.status in FAILING and not r.info.get("mutant") for r in results for v in r.verdicts) else 0


def cmd_mutants(args) -> int:
    if args.confirm and not args.machine_made:
        raise UsageError("--confirm: expected with --machine-made DIR (the folder its results go to)")
    if args.machine_made:
        from llm_inference_harness.engine import mutation

        if args.confirm:
            return mutation.run_confirm(Path(args.machine_made), [Path(p) for p in args.confirm],
                                        techniques=[args.technique] if args.technique else None,
                                        profile=args.profile, jobs=args.jobs)
        return mutation.run(Path(args.machine_made), techniques=[args.technique] if args.technique else None,
                            per_stratum=args.sample, seed=args.seed, profile=args.profile, jobs=args.jobs,
                            plan=Path(args.plan) if args.plan else None)
    return mutants([args.technique] if args.technique else sorted(load_techniques()), profile=args.profile,
                   jobs=args.jobs, json_path=args.json, score=args.score, all_properties=args.all_properties,
                   scale=_scale(args), verbose=args.verbose)


def mutants(techniques: list[str], *, profile: str, jobs: int, json_path: str | None, score: bool = False,
            all_properties: bool = False, scale: scale_out.Scale | None = None, verbose: bool = False) -> int:
    """Kill every mutant of ``techniques``: its declared killers first, stopping at the first that kills it, or every
    property (``all_properties``, implied by ``score``: the properties that killed each).  A line per technique and
    each survivor in full (``verbose``: a line per kill and two per mutant)."""
    all_properties = all_properties or score
    profiles.load(profile)
    for t in techniques:
        _known_technique(t)
    _valid_json_path(json_path)
    out = sys.stderr if json_path == "-" else sys.stdout
    documents, survivors, not_run, scores = [], [], {}, []
    scale = scale or scale_out.Scale()
    plan = scale.plan_mutants(techniques)
    for t in techniques:
        started, props = time.perf_counter(), runner.properties_of(t)
        registered = [m for m in impls(t, mutants=True) if scale.has(plan, t, m.name)]
        # stopping at its first kill, a mutant runs at most its declared killers (more only if it survives them)
        total = len(registered) * len(props) if all_properties else sum(len(m.killed_by) for m in registered)
        with Printer(t, total, out, quiet=True, verbose=verbose) as printer:
            results = scale.kill_mutants(t, plan, profile=profile, jobs=jobs, progress=printer,
                                         all_properties=all_properties)
        counts = {"killed": 0, "survived": 0, "not run here": 0}
        for result in results:
            killed, status = runner.mutant_status(result)
            why = runner.not_run_here(result)
            counts["not run here" if why else "killed" if killed else "survived"] += 1
            if verbose or not (killed or why):
                print(f"{t:<18} {result.name:<32} {status}\n{'':<18} bug: {result.info.get('bug', '?')}", file=out,
                      flush=True)
            if why:
                not_run.setdefault(why, []).append(result.name)
            elif not killed:
                survivors.append(result.name)
        if not verbose:
            print(f"{t:<18} {len(results)} mutants: " + ", ".join(f"{n} {what}" for what, n in counts.items() if n),
                  file=out, flush=True)
        document = verdicts_document(t, profile, results, time.perf_counter() - started, kind="mutants")
        if score:
            with Printer(t, len(registered), out, quiet=True) as printer:
                thorough = scale.kill_mutants(t, plan, profile="thorough", jobs=jobs, progress=printer,
                                              all_properties=False)
            document["score"] = mutant_score(results, thorough)
            scores.append((t, document["score"]))
        documents.append(document)
    if score:
        print_score(scores, profile, out)
    _write_json(json_path, scale.annotate({"schema": SCHEMA, "schema_version": provenance.SCHEMA_VERSION,
                                           "kind": "mutants", **provenance.run_info(profile), "techniques": documents},
                                          plan))
    print(f"\n{len(survivors)} mutant(s) survived" + (f": {', '.join(survivors)}" if survivors else ""), file=out)
    for why, names in not_run.items():
        print(f"{len(names)} mutant(s) not run here, {why}: {', '.join(names)}", file=out)
    return 1 if survivors else 0


def cmd_run(args) -> int:
    techniques = args.technique or sorted(load_techniques())
    start = time.perf_counter()
    root = provenance.output_root()
    summary, status = [], 0
    scale = _scale(args)
    print(f"results of this run: {root} (machine {provenance.machine_name()}, commit {provenance.commit()})")
    with provenance.staged(root / "verdicts") as verdicts:  # replaced whole at the end: never old and new mixed
        for t in techniques:
            print(f"\n=== check {t} ===", flush=True)
            rc = check(t, names=[], plugins=[], properties=[], profile=args.profile, jobs=args.jobs,
                       json_path=str(verdicts / f"{t}.json"), scale=scale, verbose=args.verbose, matrix=False)
            summary.append((f"check {t}", "ok" if rc == 0 else "FAILED"))
            status |= rc
        print("\n=== mutants ===", flush=True)
        rc = mutants(techniques, profile=args.profile, jobs=args.jobs, json_path=str(verdicts / "mutants.json"),
                     scale=scale, verbose=args.verbose)
        not_here = [m for t in techniques for m in impls(t, mutants=True) if m.unavailable]
        summary.append(("mutants killed", ("ok" if rc == 0 else "SURVIVORS")
                        + (f" ({len(not_here)} not run here: {'; '.join(sorted({m.unavailable for m in not_here}))})"
                           if not_here else "")))
        status |= rc
    if not args.no_bench:
        from llm_inference_harness.bench.quickbench import run_quick

        print("\n=== quick benchmark pass and dashboard ===", flush=True)
        rc = run_quick(quiet=not args.verbose)
        summary.append(("quick benchmarks + dashboard", "ok" if rc == 0 else "FAILED"))
        status |= rc
    if not args.no_report:
        print("\n=== report (quick: `harness report` adds the sections with sweeps of their own) ===",
              flush=True)
        rc = report(out=None, only=None, quick=True)
        summary.append(("report", "ok" if rc == 0 else "FAILED"))
        status |= rc
    print("\n=== summary ===")
    for what, result in summary:
        print(f"  {what:<30} {result}")
    print(f"  {'wall time':<30} {time.perf_counter() - start:.0f} s\n  {'results':<30} {root}")
    return status


def cmd_gate(args) -> int:
    from llm_inference_harness.bench.quickbench import gate

    return gate(args.base, args.head, args.bench)


def cmd_report(args) -> int:
    return report(out=Path(args.out) if args.out else None, only=args.only, quick=args.quick)


def report(*, out: Path | None, only: list[str] | None, quick: bool = False) -> int:
    from llm_inference_harness.bench.report import read_inputs, write_report

    read_inputs(out)  # every file it reads back, validated before any section runs
    path = write_report(out=out, only=only, quick=quick)
    print(f"report: {path}")
    return 0


# ---------------------------------------------------------------------------------------------
def verdicts_document(technique: str, profile: str, results: list[runner.ImplResult], seconds: float,
                      kind: str = "check") -> dict:
    """The versioned JSON document of a check (docs/verdicts.md)."""
    return {"schema": SCHEMA, "schema_version": provenance.SCHEMA_VERSION, "kind": kind, "technique": technique,
            **provenance.run_info(profile), "seconds": round(seconds, 3),
            "implementations": [{"name": r.name, "target": r.target.label, **{k: r.info.get(k) for k in (
                "mutant", "exact", "killed_by", "bug", "devices", "dtypes", "caps", "source")},
                "load_error": r.load_error or None} for r in results],
            "verdicts": [v.as_dict() for r in results for v in r.verdicts]}


def _write_json(path: str | None, document: dict) -> None:
    if path == "-":
        import json

        print(json.dumps(document, indent=2, default=list))
    elif path is not None:
        outputs.write_json(path, document)


def _valid_json_path(path: str | None) -> None:
    if path is not None and path != "-":
        outputs.check_file(path, "--json")


def _targets(technique: str, names: list[str], plugins: list[str]) -> list[runner.Target]:
    known = {i.name for i in impls(technique, mutants=None)}
    unknown = sorted(set(names) - known)
    if unknown:
        raise UsageError(f"no implementation {', '.join(unknown)} of {technique}; "
                         f"`harness list {technique}` shows them")
    for spec in plugins:
        _check_plugin_spec(spec)
    targets = [runner.Target(technique, name=n) for n in names] + [runner.Target(technique, plugin=s) for s in plugins]
    return targets or [runner.Target(technique, name=i.name) for i in impls(technique)]


def _check_plugin_spec(spec: str) -> None:
    """What can be told without importing the plugin (that happens in its checking process only)."""
    import importlib.util

    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise UsageError(f"--plugin must be MODULE:ATTR or FILE.py:ATTR, got {spec!r}")
    if where.endswith(".py"):
        if not Path(where).is_file():
            raise UsageError(f"--plugin {spec}: no such file {where!r}")
    elif importlib.util.find_spec(where.split(".")[0]) is None:  # the top-level package, found without importing
        raise UsageError(f"--plugin {spec}: no module named {where.split('.')[0]!r}")


def _properties(technique: str, names: list[str]) -> list[runner.Property]:
    try:
        return runner.select(runner.properties_of(technique), names)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _known_technique(name: str) -> None:
    known = load_techniques()
    if name not in known:
        raise UsageError(f"unknown technique {name!r}; known: {', '.join(sorted(known))}")


def _unique_names(results: list[runner.ImplResult]) -> None:
    """Two plugins both called `attention` (from two files) get distinct rows: `attention`, `attention#2`."""
    taken: set[str] = set()
    for r in results:
        name, n = r.name, 1
        while name in taken:
            n += 1
            name = f"{r.name}#{n}"
        taken.add(name)
        if name != r.name:
            r.info["name"] = name
            for v in r.verdicts:
                v.impl = name
