"""Command line: ``python -m harness list | check | mutants | run``.

Each implementation is checked in a forked child process, so one that segfaults or calls exit()
gets a FAIL verdict and the run goes on; hangs inside a call are caught by the per-call limit of
harness.guard.  The parent does no tensor work before forking (torch's thread pools do not
survive a fork).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from harness import profiles
from harness.contracts import load_techniques
from harness.quickbench import GATE_FACTOR
from harness.registry import LOAD_ERRORS, Impl, get, impls
from harness.runner import Property, Verdict, kill_mutant, properties_of, reproduce_command, run_property

VERDICTS = Path(__file__).resolve().parents[1] / "results" / "report" / "verdicts"
PER_IMPL_LIMIT_S = float(os.environ.get("HARNESS_PER_IMPL_LIMIT_S", "900"))
MARK = {"pass": "pass", "FAIL": "FAIL", "skip": "skip"}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return args.func(args)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    ls = sub.add_parser("list", help="techniques, implementations, capabilities, mutants")
    ls.add_argument("technique", nargs="?")
    ls.set_defaults(func=cmd_list)

    ck = sub.add_parser("check", help="run every property of a technique against implementations")
    ck.add_argument("technique")
    ck.add_argument("--impl", action="append", default=[], metavar="NAME", help="registered implementation")
    ck.add_argument("--plugin", action="append", default=[], metavar="MODULE:ATTR|FILE.py:ATTR")
    ck.add_argument("--property", action="append", default=[], metavar="NAME", help="only these properties")
    _common(ck)
    ck.set_defaults(func=cmd_check)

    mu = sub.add_parser("mutants", help="run the properties against every mutant; fail if one survives")
    mu.add_argument("technique", nargs="?")
    _common(mu)
    mu.set_defaults(func=cmd_mutants)

    run = sub.add_parser("run", help="the main job: check everything, kill every mutant, quick benchmarks")
    _common(run)
    run.add_argument("--no-bench", action="store_true", help="skip the quick benchmark pass")
    run.add_argument("--no-report", action="store_true", help="skip writing results/report")
    run.set_defaults(func=cmd_run)

    gate = sub.add_parser("gate", help="regression gate: asv continuous BASE HEAD, fails on a slowdown > factor")
    gate.add_argument("base")
    gate.add_argument("head", nargs="?", default="HEAD")
    gate.add_argument("--factor", type=float, default=GATE_FACTOR, help="allowed slowdown (default suits a noisy VM)")
    gate.add_argument("--bench", metavar="REGEX", help="only benchmarks matching REGEX")
    gate.set_defaults(func=cmd_gate)

    rep = sub.add_parser("report", help="write results/report (Markdown + PNG plots measured here)")
    rep.add_argument("--only", action="append", metavar="SECTION", help="only sections whose title contains this")
    rep.set_defaults(func=cmd_report)
    return p


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="ci", choices=profiles.PROFILES, help="Hypothesis profile (default ci)")
    p.add_argument("--json", metavar="FILE", help="also write the verdicts as JSON")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="implementations checked at once")


# ---------------------------------------------------------------------------------------------
def cmd_list(args) -> int:
    techniques = load_techniques()
    names = [args.technique] if args.technique else sorted(techniques)
    for name in names:
        if name not in techniques:
            print(f"unknown technique {name!r}; known: {', '.join(sorted(techniques))}", file=sys.stderr)
            return 2
        t = techniques[name]
        print(f"{t.name}: {t.summary}\n  contract: {t.signature}")
        for r in impls(name, mutants=None):
            kind = f"MUTANT ({r.bug}; killed by {', '.join(r.killed_by)})" if r.mutant else (
                "exact" if r.exact else "approximate")
            print(f"  {r.name:<28} {kind}\n  {'':<28} devices={','.join(r.devices)} dtypes={','.join(r.dtypes)}"
                  + (f" caps={dict(r.caps)}" if r.caps else "") + (f"\n  {'':<28} {r.cite}" if r.cite else ""))
        print()
    _report_load_errors()
    return 0


def cmd_check(args) -> int:
    profiles.load(args.profile)
    _known_technique(args.technique)
    unknown = sorted(set(args.impl) - {i.name for i in impls(args.technique, mutants=None)})
    if unknown:
        raise SystemExit(f"check: no implementation {', '.join(unknown)} of {args.technique}; "
                         f"`python -m harness list {args.technique}` shows them")
    chosen = [get(args.technique, n) for n in args.impl]
    chosen += _unique_names([_load_plugin(spec, args.technique) for spec in args.plugin], taken=set(args.impl))
    if not chosen:
        chosen = impls(args.technique)
    props = _select(properties_of(args.technique), args.property)
    jobs = []
    for impl in chosen:
        plugin = impl.source if impl.source in args.plugin else None
        jobs.append((impl, props, lambda i=impl, pl=plugin: (run_property(p, i, profile=args.profile, plugin=pl)
                                                             for p in props),
                     lambda p, i=impl, pl=plugin: reproduce_command(i, p, args.profile, pl)))
    verdicts = [v for got in _isolated_all(jobs, args.jobs) for v in got]
    _print_matrix(args.technique, chosen, props, verdicts)
    _write_json(args.json, verdicts)
    _report_load_errors()
    bad = [v for v in verdicts if v.status == "FAIL" and not get_impl(chosen, v.impl).mutant]
    return 1 if bad else 0


def cmd_mutants(args) -> int:
    profiles.load(args.profile)
    if args.technique:
        _known_technique(args.technique)
    techniques = [args.technique] if args.technique else sorted(load_techniques())
    survivors, verdicts = [], []
    for t in techniques:
        props = properties_of(t)
        mutants = impls(t, mutants=True)
        jobs = [(m, props, lambda m=m, ps=props: kill_mutant(m, ps, profile=args.profile, all_properties=True),
                 lambda p, m=m: reproduce_command(m, p, args.profile, None)) for m in mutants]
        for m, got in zip(mutants, _isolated_all(jobs, args.jobs), strict=True):
            verdicts += got
            killers = [v.property for v in got if v.status == "FAIL"]
            right = sorted(set(killers) & set(m.killed_by))
            status = f"killed by {', '.join(right)}" if right else (
                f"SURVIVED its declared killers {m.killed_by}" + (f" (other failures: {killers})" if killers else ""))
            print(f"{t:<14} {m.name:<32} {status}\n{'':<14} bug: {m.bug}")
            if not right:
                survivors.append(m.name)
    _write_json(args.json, verdicts)
    print(f"\n{len(survivors)} mutant(s) survived" + (f": {', '.join(survivors)}" if survivors else ""))
    return 1 if survivors else 0


def cmd_run(args) -> int:
    start = time.perf_counter()
    summary, status = [], 0
    VERDICTS.mkdir(parents=True, exist_ok=True)
    for t in sorted(load_techniques()):
        print(f"\n=== check {t} ===")
        rc = cmd_check(argparse.Namespace(technique=t, impl=[], plugin=[], property=[], profile=args.profile,
                                          jobs=args.jobs, json=str(VERDICTS / f"{t}.json")))
        summary.append((f"check {t}", "ok" if rc == 0 else "FAILED"))
        status |= rc
    print("\n=== mutants ===")
    rc = cmd_mutants(argparse.Namespace(technique=None, profile=args.profile, jobs=args.jobs,
                                        json=str(VERDICTS / "mutants.json")))
    summary.append(("mutants killed", "ok" if rc == 0 else "SURVIVORS"))
    status |= rc
    if not args.no_bench:
        from harness.quickbench import run_quick

        print("\n=== quick benchmark pass and dashboard ===")
        rc = run_quick()
        summary.append(("quick benchmarks + dashboard", "ok" if rc == 0 else "FAILED"))
        status |= rc
    if not args.no_report:
        print("\n=== report ===")
        rc = cmd_report(argparse.Namespace(only=None))
        summary.append(("report (results/report)", "ok" if rc == 0 else "FAILED"))
        status |= rc
    print("\n=== summary ===")
    for what, result in summary:
        print(f"  {what:<30} {result}")
    print(f"  {'wall time':<30} {time.perf_counter() - start:.0f} s")
    return status


def cmd_gate(args) -> int:
    from harness.quickbench import gate

    return gate(args.base, args.head, args.factor, args.bench)


def cmd_report(args) -> int:
    from harness.report import write_report

    path = write_report(only=args.only)
    print(f"report: {path}")
    return 0


# ---------------------------------------------------------------------------------------------
Job = tuple[Impl, list[Property], Callable[[], Iterable[Verdict]], Callable[[Property], str]]


def _isolated_all(jobs: list[Job], workers: int):
    """`_isolated` for several implementations, ``workers`` children at a time, results in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # threads only wait on their child
        return list(pool.map(lambda j: _isolated(*j, one_thread=workers > 1), jobs))


def _isolated(impl: Impl, props: list[Property], job: Callable[[], Iterable[Verdict]],
              reproduce: Callable[[Property], str], one_thread=False):
    """Run ``job`` (yielding verdicts for one implementation) in a forked child, streaming verdicts back.
    Properties the child never reported (it hung or died) get a FAIL saying so, with their reproduce line."""

    def child(queue) -> None:
        if one_thread:  # children share the cores: intra-op threads would only spin against each other
            import torch

            torch.set_num_threads(1)
        for verdict in job():
            queue.put(verdict)
        queue.put(None)
        queue.close()
        queue.join_thread()

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,), daemon=True)
    proc.start()
    got: list[Verdict] = []
    deadline = time.monotonic() + PER_IMPL_LIMIT_S
    while True:
        try:
            item = queue.get(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
        except Exception:  # queue.Empty
            if proc.is_alive() and time.monotonic() < deadline:
                continue
            break
        if item is None:
            break
        got.append(item)
    proc.join(timeout=5)
    if proc.is_alive():
        proc.kill()
        why = f"hung: exceeded the per-implementation limit of {PER_IMPL_LIMIT_S:g} s"
    else:
        why = f"crashed: the checking process died with exit code {proc.exitcode}"
    done = {v.property for v in got}
    for p in props:
        if p.name not in done and len(got) < len(props):
            got.append(Verdict(impl.name, p.name, "FAIL", message=why, reproduce=reproduce(p)))
    return got


def _select(props: list[Property], names: list[str]) -> list[Property]:
    if not names:
        return props
    known = {p.name for p in props}
    unknown = sorted(set(names) - known)
    if unknown:
        raise SystemExit(f"--property: unknown {unknown}; known: {', '.join(sorted(known))}")
    return [p for p in props if p.name in names]


def _load_plugin(spec: str, technique: str) -> Impl:
    from harness.plugins import load_plugin

    try:
        return load_plugin(spec, technique)
    except Exception as exc:
        raise SystemExit(f"--plugin {spec}: {type(exc).__name__}: {exc}") from exc


def _known_technique(name: str) -> None:
    known = load_techniques()
    if name not in known:
        raise SystemExit(f"unknown technique {name!r}; known: {', '.join(sorted(known))}")


def _unique_names(plugins: list[Impl], taken: set[str]) -> list[Impl]:
    """Two plugins both called `attention` (from two files) get distinct rows: `attention`, `attention#2`."""
    unique = []
    for impl in plugins:
        name, n = impl.name, 1
        while name in taken:
            n += 1
            name = f"{impl.name}#{n}"
        taken.add(name)
        unique.append(impl if name == impl.name else dataclasses.replace(impl, name=name))
    return unique


def get_impl(chosen: list[Impl], name: str) -> Impl:
    return next(i for i in chosen if i.name == name)


def _print_matrix(technique: str, chosen: list[Impl], props: list[Property], verdicts: list[Verdict]) -> None:
    cell = {(v.impl, v.property): v for v in verdicts}
    width = max([len(i.name) for i in chosen] + [14])
    print(f"\n{technique}: implementation x property\n")
    for n, p in enumerate(props):
        print(f"  [{n}] {p.name}")
    print(f"\n  {'':<{width}} " + " ".join(f"{f'[{n}]':>5}" for n in range(len(props))))
    for impl in chosen:
        row = [MARK[cell[(impl.name, p.name)].status] for p in props]
        print(f"  {impl.name:<{width}} " + " ".join(f"{c:>5}" for c in row) + ("   (mutant)" if impl.mutant else ""))
    for v in verdicts:
        if v.status == "FAIL":
            print(f"\nFAIL {v.impl} / {v.property}: {v.message}")
            if v.counterexample:
                print("  " + v.counterexample.replace("\n", "\n  "))
            if v.reproduce:
                print(f"  reproduce: {v.reproduce}")
    skips = sorted({(v.property, v.message) for v in verdicts if v.status == "skip"})
    for prop, why in skips:
        print(f"skip {prop}: {why}")
    passed = sum(v.status == "pass" for v in verdicts)
    failed = sum(v.status == "FAIL" for v in verdicts)
    print(f"\n{passed} passed, {failed} failed, {len(verdicts) - passed - failed} skipped")


def _write_json(path: str | None, verdicts: list[Verdict]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump([v.as_dict() for v in verdicts], f, indent=2)


def _report_load_errors() -> None:
    for line in LOAD_ERRORS:
        print(f"warning: plugin {line}", file=sys.stderr)
