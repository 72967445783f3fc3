"""What a person reads of a check: a live bar on a terminal, or in a log a progress line at most every 30 s and each
failure as it comes; then the implementation x property matrix (not in `harness run`), each failure with its
contract rule, example and reproduce lines, a line per known upstream failure and per skip reason with its count,
and a summary line.  ``-v`` (``verbose`` / ``detail``) prints every line: per finished (implementation, property),
per skip, each upstream failure in full."""

from __future__ import annotations

import re
import sys
import time

from llm_inference_harness.engine import runner
from llm_inference_harness.engine.registry import LOAD_ERRORS

MARK = {"pass": "pass", "FAIL": "FAIL", "skip": "skip", "upstream": "upstr", "stale": "STALE"}
NOT_RUN = "not run:"  # the message of a property its implementation's process never reached


def print_matrix(technique: str, results: list[runner.ImplResult], props: list[runner.Property], out, *,
                 detail: bool = False, matrix: bool = True) -> None:
    """The matrix (unless not ``matrix``: `harness run` leaves it to the JSON and ``-v``), each failure in full, the
    known upstream failures one line per implementation and record, the skips one line per reason with its count
    (``detail``: each upstream failure in full with its minimal reproduction, one skip line per property and
    reason), and a summary line."""
    def say(*lines: str) -> None:
        print(*lines, sep="\n", file=out)

    if matrix:
        _matrix(technique, results, props, say)
    verdicts = [v for r in results for v in r.verdicts]
    for v in verdicts:
        shown = v.status in ("FAIL", "stale") or v.status == "upstream" and detail  # upstream: one line, below
        if shown and not v.message.startswith(NOT_RUN):
            say(f"\n{v.status.upper()} {v.impl} / {v.property}: {v.message}")
            if v.counterexample:
                say("  " + v.counterexample.replace("\n", "\n  "))
            if v.output:
                say("  output of the implementation:", "    " + v.output.strip().replace("\n", "\n    "))
            lines = v.reproduce.splitlines()  # one per distinct failure Hypothesis found
            for i, line in enumerate(lines, 1):
                say(f"  reproduce{f' failure {i} of {len(lines)}' if len(lines) > 1 else ''}: {line}")
    upstream: dict[tuple[str, str], list[str]] = {}  # (implementation, its record) -> the properties it failed
    for v in verdicts:
        if v.status == "upstream" and not detail:
            upstream.setdefault((v.impl, v.message.split("; this run:")[0]), []).append(v.property)
    if upstream:
        say("", *(f"upstr {impl}: {len(names)} propert{'ies' if len(names) > 1 else 'y'} ({', '.join(names[:2])}"
                  f"{' and more' if len(names) > 2 else ''}): {record[:160]}{'...' if len(record) > 160 else ''}"
                  for (impl, record), names in upstream.items()))
    not_run: dict[tuple[str, str], list[str]] = {}  # (implementation, why) -> the properties never reached
    for v in verdicts:
        if v.status == "FAIL" and v.message.startswith(NOT_RUN):
            not_run.setdefault((v.impl, v.message.removeprefix(NOT_RUN).strip()), []).append(v.property)
    for (impl, why), props_left in not_run.items():
        named = ", ".join(props_left[:3]) + (f" and {len(props_left) - 3} more" if len(props_left) > 3 else "")
        say(f"\nNOT RUN {impl}: {len(props_left)} properties ({named}): {why}")
    if detail:
        for prop, why in sorted({(v.property, v.message) for v in verdicts if v.status == "skip"}):
            say(f"skip {prop}: {why}")
    elif reasons := skip_reasons(verdicts):
        say(*reasons)
    count = {s: sum(v.status == s for v in verdicts) for s in MARK}
    unreached = sum(map(len, not_run.values()))
    say(("\n" if matrix else f"{technique} ({len(results)} implementations x {len(props)} properties): ")
        + f"{count['pass']} passed, {count['FAIL'] - unreached} failed, {count['skip']} skipped"
        + (f", {unreached} not run" if unreached else "")
        + (f", {count['upstream']} known upstream failures" if count["upstream"] else "")
        + (f", {count['stale']} stale upstream records" if count["stale"] else ""))


def _matrix(technique: str, results: list[runner.ImplResult], props: list[runner.Property], say) -> None:
    cell = {(r.name, v.property): v for r in results for v in r.verdicts}
    width = max([len(r.name) for r in results] + [14])
    say(f"\n{technique}: implementation x property\n", *(f"  [{n}] {p.name}" for n, p in enumerate(props)))
    say(f"\n  {'':<{width}} " + " ".join(f"{f'[{n}]':>5}" for n in range(len(props))))
    for r in results:
        row = [MARK[cell[(r.name, p.name)].status] if (r.name, p.name) in cell else "?" for p in props]
        mutant = "   (mutant)" if r.info.get("mutant") else ""
        say(f"  {r.name:<{width}} " + " ".join(f"{c:>5}" for c in row) + mutant)
    declared = [(r.name, r.info["caps"]) for r in results if not r.info.get("mutant") and r.info.get("caps")]
    if declared:  # what each implementation declares beyond the defaults: a looser format is visible here
        say("", *(f"  {name} declares {', '.join(f'{k}={v}' for k, v in caps.items())}" for name, caps in declared))


def skip_reasons(verdicts: list[runner.Verdict]) -> list[str]:
    """One line per reason a property was skipped, most frequent first, with how many skips, implementations and
    properties it covers.  A reason is the skip's message without the implementation's name in front (``X does not
    declare 'triton'``) or behind (``...; X declares ('group',)``) and without a closing remark in parentheses, which
    may vary per property; the line quotes the message where the group's are all the same, else that reason."""
    groups: dict[str, list[runner.Verdict]] = {}
    for v in verdicts:
        if v.status == "skip":
            groups.setdefault(_reason(v), []).append(v)
    lines = []
    for group in sorted(groups.values(), key=lambda g: (-len(g), _reason(g[0]))):
        impls, props = len({v.impl for v in group}), len({v.property for v in group})
        said = {v.message.removeprefix(f"{v.impl} ") for v in group}
        lines.append(f"skip {len(group):>3}: {said.pop() if len(said) == 1 else _reason(group[0])} -- "
                     f"{impls} implementation{'s' * (impls > 1)} x {props} propert{'ies' if props > 1 else 'y'}")
    return lines


def _reason(v: runner.Verdict) -> str:
    said = re.sub(rf"; {re.escape(v.impl)} declares .*$", "", v.message.removeprefix(f"{v.impl} "))
    return re.sub(r" \([^()]* [^()]*\)$", "", said)


def report_load_errors() -> None:
    for line in LOAD_ERRORS:
        print(f"warning: plugin {line}", file=sys.stderr)


class Printer(runner.Progress):
    """Progress of a check: a live bar on a terminal, which keeps failures and notes above it; elsewhere (a log) a
    line with the count and the technique's ETA at most every EVERY_S seconds, and each failure as it comes.
    ``verbose``: a line per finished (implementation, property) with its time.  ``quiet`` (mutants, where a failure
    is a kill): no failure lines."""

    SLOW_S = 30.0  # a property still running after this long says so, with what its process reported
    EVERY_S = 30.0

    def __init__(self, technique: str, total: int, out, quiet: bool = False, verbose: bool = False) -> None:
        self.technique, self.total, self.out, self.quiet, self.verbose = technique, total, out, quiet, verbose
        self.done, self.started_at, self.running, self.warned = 0, time.monotonic(), {}, set()
        self.bar, self.said_at = None, self.started_at

    def __enter__(self) -> Printer:
        if self.out.isatty() and self.total:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc=self.technique, file=self.out, unit="check", leave=False)
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()

    def _say(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.out)
        else:
            print(text, file=self.out, flush=True)

    def started(self, target, prop: str) -> None:
        self.running[target] = (prop, time.monotonic())

    def finished(self, target, verdict) -> None:
        self.done += 1
        self.running.pop(target, None)
        elapsed = time.monotonic() - self.started_at
        eta = elapsed / self.done * max(0, self.total - self.done)
        unreached = verdict.message.startswith(NOT_RUN)  # said once, grouped, under the matrix
        if self.bar is not None:
            self.bar.update(1)
            if verdict.status == "FAIL" and not self.quiet and not unreached:
                self._say(f"  FAIL {verdict.impl} / {verdict.property} ({verdict.seconds:.1f} s)")
        elif unreached:
            pass
        elif self.verbose and (not self.quiet or verdict.status == "FAIL") or (
                verdict.status == "FAIL" and not self.quiet):
            self._say(f"  [{self.technique} {self.done}/{self.total}, ETA {_duration(eta)}] {verdict.impl} / "
                      f"{verdict.property}: {verdict.status} ({verdict.seconds:.1f} s)")
        elif time.monotonic() - self.said_at >= self.EVERY_S and self.done < self.total:
            self.said_at = time.monotonic()
            self._say(f"  [{self.technique} {self.done}/{self.total}, ETA {_duration(eta)}]")

    def note(self, target, text: str) -> None:
        self._say(f"  note {target.label}: {text}")

    def tick(self) -> None:
        now = time.monotonic()
        for target, (prop, since) in self.running.items():
            if now - since > self.SLOW_S and (target, prop) not in self.warned:
                self.warned.add((target, prop))
                self._say(f"  still running: {target.label} / {prop} after {now - since:.0f} s")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def mutant_score(first: list[runner.ImplResult], thorough: list[runner.ImplResult]) -> dict:
    """Per mutant: killed under the run's profile (all properties) and under thorough (its declared killers), the
    properties that killed it, and the margin of its declared killer's failing case (error / bound, where the
    killer compares with an earned bound); and the technique's counts and median margin."""
    by_name = {r.name: r for r in thorough}
    rows = []
    for r in first:
        killed, _ = runner.mutant_status(r)
        declared = [v for v in r.verdicts if v.status == "FAIL" and v.property in r.info.get("killed_by", ())]
        margins = [v.margin for v in declared if v.margin is not None]
        rows.append({"mutant": r.name, "killed": killed, "not_run_here": runner.not_run_here(r),
                     "killed_thorough": by_name[r.name].verdicts != [] and runner.mutant_status(by_name[r.name])[0],
                     "killers": [v.property for v in r.verdicts if v.status == "FAIL"],
                     "margin": max(margins) if margins else None})
    margins = sorted(row["margin"] for row in rows if row["margin"] is not None)
    return {"mutants": rows, "killed": sum(row["killed"] for row in rows),
            "killed_thorough": sum(row["killed_thorough"] for row in rows),
            "median_margin": margins[len(margins) // 2] if margins else None}


def print_score(scores: list[tuple[str, dict]], profile: str, out) -> None:
    print(f"\nmutant power ({profile}: every property; thorough: the declared killers)\n", file=out)
    print(f"  {'technique':<20} {'mutants':>7} {'killed ' + profile:>12} {'killed thorough':>16} {'median margin':>14}",
          file=out)
    for t, s in scores:
        margin = f"{s['median_margin']:.3g}" if s["median_margin"] is not None else "-"
        print(f"  {t:<20} {len(s['mutants']):>7} {s['killed']:>12} {s['killed_thorough']:>16} {margin:>14}", file=out)
    for t, s in scores:
        print(f"\n  {t}", file=out)
        for row in s["mutants"]:
            margin = f", margin {row['margin']:.3g}" if row["margin"] is not None else ""
            killers = f"not run here: {row['not_run_here']}" if row["not_run_here"] else \
                f"killed by {', '.join(row['killers']) or 'NOTHING'}{margin}"
            print(f"    {row['mutant']:<40} {killers}", file=out)
