"""A/B comparison that sees a 5% change on a shared machine: ``harness compare BASE HEAD``.

Both commits' code runs in one session: each commit gets a git worktree and a virtual environment of its own
(the running interpreter's packages -- torch -- reached through a .pth file, the project installed editable
with --no-deps: no network), and a worker process (harness/bench/benchworker.py) per side.  The same benchmark suite
(this checkout's benchmarks/, as asv uses) runs on both.  For each case the two workers take turns, round after
round, the order flipping each round (A B, B A, A B, ...), so load that comes and goes on a shared machine falls
on both sides alike and cancels in each round's ratio HEAD / BASE.  A ``time_`` case is read as the fastest
call's CPU time in each sample, on one torch thread, both sides of a round on one CPU (`Rounds` says why).

The rounds are spread over PAIRS pairs of fresh workers, ROUNDS / PAIRS rounds each.  A process's memory layout
(where ASLR put the libraries, how its heap came out) moves every round it runs by the same few per cent
(Mytkowicz et al., "Producing wrong data without doing anything obviously wrong!", ASPLOS 2009): two processes of
identical code measured here differed by 2-3% for a whole comparison, so the rounds of one pair are not
independent evidence, and an interval over them is too narrow.  The pair is
the unit: each pair's estimate is the median of its rounds' log ratios; the ratio is the Hodges-Lehmann
estimate (median of the Walsh averages) of the pairs' estimates, with the distribution-free confidence interval
that inverts the Wilcoxon signed-rank test (Hollander & Wolfe, Nonparametric Statistical Methods, Sec. 3.2): a
load spike in one pair moves it by one rank, not by its size.

Verdict: ``slower`` / ``faster`` when the CONFIDENCE interval excludes 1 and the estimate is at least MIN_EFFECT
away from 1, ``noisy`` when neither holds and the interval still reaches NOISY away from 1 (the comparison
cannot rule such a change out), else ``same``.  For ``track_`` values the verdict is ``higher`` / ``lower``, and
``worse`` / ``better`` where the benchmark's unit says which way is better.

Two registered implementations on one commit go through the same engine (``--impls A B``): two workers of one
environment, the cases whose parameters name A paired with the same cases naming B.

`power` validates all this honestly: copies of the repository whose llm_inference_harness.bench.calibrated.COST is
raised by 5, 10, 20% (and 0%: a copy that changes nothing but a comment) are compared with the original again and again
(docs/benchmarks.md has the measured detection and false-alarm rates).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import select
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llm_inference_harness.engine import outputs, provenance
from llm_inference_harness.engine.inputs import UsageError

ROOT = provenance.ROOT
ENVS = ROOT / ".asv" / "compare"  # worktrees and environments, one per commit, reused (git-ignored)
WORKER = Path(__file__).with_name("benchworker.py")
ROUNDS = 160
PAIRS = 16  # chosen by simulation to see 5% at >= 95% power (docs/benchmarks.md); 8 is the fewest that can exclude 1
FIRST_LOOK = 8  # pairs after which a comparison stops once every case's interval lies within or beyond the floor
MIN_ROUNDS = 10  # a case's fewest rounds, over all its pairs, however slow a round is
BUDGET_S = 120.0  # a case whose rounds are slow gets fewer of them, not a longer comparison
CONFIDENCE = 0.99
MIN_EFFECT = 0.025
NOISY = 0.05
WORSE = ("slower", "worse")
HIGHER_IS_BETTER = {"GFLOP/s", "TFLOP/s", "GB/s", "speedup", "x", "tokens/call", "fraction", "a", "requests"}
CALIBRATED = r"^bench_harness\.Calibrated\.time_work$"


# ------------------------------------------------------------------------------------------ statistics
def signed_rank_interval(d, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(Hodges-Lehmann estimate, lower, upper) of the centre of ``d``: the median of the n(n+1)/2 Walsh
    averages (d_i + d_j) / 2, i <= j, and the ones at the ranks where the exact null distribution of the
    signed-rank statistic leaves (1 - confidence) / 2 in each tail.  +-inf when n is too small for it."""
    import numpy as np

    d = np.sort(np.asarray(d, dtype=float))
    n = len(d)
    i, j = np.triu_indices(n)
    walsh = np.sort((d[i] + d[j]) / 2)  # (n(n+1)/2,)
    counts = np.zeros(len(walsh) + 1)  # ways to reach each signed-rank sum T = 0 .. n(n+1)/2
    counts[0] = 1.0
    for rank in range(1, n + 1):
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    cdf = np.cumsum(counts) / 2.0**n
    c = int(np.sum(cdf <= (1 - confidence) / 2))  # P(T <= c - 1) <= alpha / 2
    if c == 0:
        return float(np.median(walsh)), -math.inf, math.inf
    return float(np.median(walsh)), float(walsh[c - 1]), float(walsh[len(walsh) - c])


@dataclass
class Result:
    name: str
    params: tuple
    kind: str = "time"
    unit: str | None = None
    clock: str = "cpu"
    verdict: str = "skipped"
    ratio: float = math.nan  # HEAD / BASE (B / A)
    low: float = math.nan
    high: float = math.nan
    p_value: float = math.nan
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    pairs: list[int] = field(default_factory=list)  # the worker pair each round ran in (empty: one pair)
    pair_logs: list[float] = field(default_factory=list)  # each pair's median log ratio: what the interval is over
    seconds: float = 0.0
    why: str = ""

    @property
    def label(self) -> str:
        return self.name + (f"({', '.join(map(repr, self.params))})" if self.params else "")


def judge(r: Result, higher_is_better: bool | None = None, min_effect: float = MIN_EFFECT) -> Result:
    """Fill in the ratio, its interval, the signed-rank p-value and the verdict from the paired rounds: over
    the pairs' median log ratios where the rounds came from several worker pairs, else over the rounds."""
    import numpy as np
    from scipy.stats import wilcoxon

    a, b = np.asarray(r.a, dtype=float), np.asarray(r.b, dtype=float)
    if not _measurable(r):
        r.verdict, r.ratio = "unmeasurable", float(np.median(b) / np.median(a)) if len(a) and np.median(a) else math.nan
        r.why = r.why or f"{len(a)} rounds of positive values needed for a ratio"
        return r
    d = _log_ratios(r)
    if len(set(r.pairs)) > 1:
        r.pair_logs = [float(x) for x in d]
    centre, low, high = signed_rank_interval(d)
    r.ratio, r.low, r.high = math.exp(centre), math.exp(low), math.exp(high)
    r.p_value = float(wilcoxon(d).pvalue) if np.any(d != 0) else 1.0
    if r.low > 1 and r.ratio >= 1 + min_effect:
        up = True
    elif r.high < 1 and r.ratio <= 1 / (1 + min_effect):
        up = False
    else:
        r.verdict = "noisy" if r.low < 1 / (1 + NOISY) or r.high > 1 + NOISY else "same"
        return r
    if r.kind == "time":
        r.verdict = "slower" if up else "faster"
    elif higher_is_better is None:
        r.verdict = "higher" if up else "lower"
    else:
        r.verdict = "better" if up == higher_is_better else "worse"
    return r


def _measurable(r: Result) -> bool:
    """At least 6 rounds, every value positive: a ratio of non-positive values means nothing."""
    return len(r.a) >= 6 and min(r.a + r.b) > 0


def _log_ratios(r: Result):
    """What the interval is over: each pair's median log ratio B / A where the rounds came from several worker
    pairs, else each round's."""
    import numpy as np

    d = np.log(np.asarray(r.b, dtype=float) / np.asarray(r.a, dtype=float))
    if len(set(r.pairs)) <= 1:
        return d
    pair = np.asarray(r.pairs)
    return np.array([np.median(d[pair == p]) for p in sorted(set(r.pairs))])  # (pairs,)


def settled(r: Result, min_effect: float = MIN_EFFECT) -> bool:
    """Whether the case's CONFIDENCE interval over the pairs measured so far lies wholly within ``min_effect`` of 1
    (no change the verdict could call is left in it: same) or wholly beyond it on one side (a change of at least
    ``min_effect`` is shown: slower or faster), so that the comparison may stop, as group sequential trials stop
    for futility or for efficacy.  Each look from FIRST_LOOK pairs on is a chance to stop: `design` simulates
    these very looks, and docs/benchmarks.md has what they cost in power and false alarms."""
    if not _measurable(r):
        return False
    _, low, high = signed_rank_interval(_log_ratios(r))
    floor = math.log1p(min_effect)
    return bool(-floor < low and high < floor or low > floor or high < -floor)


# ------------------------------------------------------------------------------------------ environments
def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


def prepare(commit: str, repo: Path = ROOT) -> tuple[Path, Path]:
    """(interpreter, source tree) of ``commit``: a worktree and a venv, built once and kept in ENVS."""
    sha = git(repo, "rev-parse", f"{commit}^{{commit}}")
    home = ENVS / sha[:16]
    src, venv = home / "src", home / "venv"
    python = venv / "bin" / "python"
    if (home / "ready").is_file():
        return python, src
    shutil.rmtree(home, ignore_errors=True)
    subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)
    home.mkdir(parents=True)
    git(repo, "worktree", "add", "--detach", "--force", str(src), sha)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "_harness_base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch & co., appended
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                              "--no-index", "-e", str(src)], capture_output=True, text=True)
    if install.returncode:
        raise RuntimeError(f"installing {sha[:12]} failed:\n{install.stderr[-2000:]}")
    (home / "ready").write_text(sha + "\n")
    return python, src


# ------------------------------------------------------------------------------------------ workers
class Worker:
    """One benchmark process of one commit (harness/bench/benchworker.py), answering one JSON line per request."""

    def __init__(self, python: Path, src: Path, suite: Path = ROOT / "benchmarks", limit_s: float = 900,
                 script: Path = WORKER) -> None:
        self.limit_s = limit_s
        self.log = tempfile.TemporaryFile(mode="w+")
        boot = f"import runpy, sys; sys.argv = ['benchworker', {str(suite)!r}]; " \
               f"runpy.run_path({str(script)!r}, run_name='__main__')"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen([str(python), "-c", boot], cwd=src, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)

    def ask(self, op: str, **request) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **request}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], self.limit_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            self.log.seek(0)
            raise RuntimeError(f"benchmark worker {'timed out' if not ready else 'died'} on {op}: "
                               f"{self.log.read()[-3000:]}")
        return json.loads(line)

    def cases(self, pattern: str) -> list[tuple[str, tuple]]:
        answer = self.ask("list", pattern=pattern)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        self.failed = answer.get("failed", [])
        return [(name, tuple(params)) for name, params in answer["cases"]]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Rounds:
    """One case's rounds, spread over the worker pairs: ``pair`` sets the case up in both workers of a pair and
    runs its share of rounds, the order flipped every round; ``result`` judges them (B / A).  The first pair
    fixes the calls per sample (both sides, every pair) and the rounds per pair: rounds / pairs, fewer (down to
    MIN_ROUNDS over all pairs) where a round takes more than budget_s / rounds.  A time_ case runs on
    ``threads`` torch threads (0: as the benchmark sets them) and is read in ``clock`` seconds per call: "cpu",
    the fastest call's CPU time in the sample (a call that other processes preempted costs more, never less), or
    "wall"; a cuda case always in wall seconds.  On one thread, both sides of a round run on the same CPU, the
    next round on the next CPU: a core slowed by its neighbours (a busy hyperthread sibling on the host) then
    slows both sides of a round, not one process for the whole comparison."""

    def __init__(self, case_a: tuple[str, tuple], case_b: tuple[str, tuple], *, rounds: int = ROUNDS,
                 pairs: int = PAIRS, budget_s: float = BUDGET_S, clock: str = "cpu", threads: int = 1) -> None:
        self.case_a, self.case_b = case_a, case_b
        self.r = Result(*case_b, kind=case_b[0].rsplit(".", 1)[-1].split("_", 1)[0])
        self.timed = self.r.kind == "time"
        self.r.clock = "value" if not self.timed else "wall" if clock == "wall" or "cuda" in case_b[1] else "cpu"
        self.extra = {"threads": threads} if self.timed and threads else {}
        self.pin = self.timed and threads == 1
        self.rounds, self.pairs, self.budget_s = rounds, pairs, budget_s
        self.per_pair: int | None = None
        self.number = None
        self.problem: str | None = None
        self.answers: list[dict] = []

    def pair(self, a: Worker, b: Worker, p: int) -> None:
        if self.problem is not None:
            return
        started = time.perf_counter()
        (name_a, params_a), (name_b, params_b) = self.case_a, self.case_b
        first = a.ask("setup", name=name_a, params=list(params_a), number=self.number, **self.extra)
        self.number = self.number or first.get("number")
        self.answers = [first, b.ask("setup", name=name_b, params=list(params_b), number=self.number, **self.extra)]
        self.problem = next((x.get("skip") or x.get("error") for x in self.answers if not x.get("ok")), None)
        key = "cpu" if self.r.clock == "cpu" else "value"
        cpus = sorted(os.sched_getaffinity(0))
        i = 0
        while self.problem is None and i < (self.per_pair or 1):
            k = len(self.r.pairs)  # rounds so far, over every pair
            round_started = time.perf_counter()
            pin = {"cpu": cpus[k % len(cpus)]} if self.pin else {}
            for worker, values in ((a, self.r.a), (b, self.r.b)) if k % 2 == 0 else ((b, self.r.b), (a, self.r.a)):
                answer = worker.ask("sample", **pin)
                if "error" in answer:
                    self.problem = answer["error"]
                    break
                values.append(answer[key])
            else:
                self.r.pairs.append(p)
            if self.per_pair is None:
                fits = int(self.budget_s / self.pairs / (time.perf_counter() - round_started))
                self.per_pair = max(-(-MIN_ROUNDS // self.pairs), min(self.rounds // self.pairs, fits))
            i += 1
        del self.r.a[len(self.r.pairs):], self.r.b[len(self.r.pairs):]  # a round cut short by an error
        for worker in (a, b):
            worker.ask("teardown")
        self.r.seconds += time.perf_counter() - started

    def result(self) -> Result:
        r = self.r
        r.unit = (self.answers[1].get("unit") if self.answers else None) or ("s" if r.kind == "time" else None)
        if self.problem:
            r.verdict = "skipped" if any("skip" in x for x in self.answers) else "error"  # a raising sample: error
            r.why = self.problem
            return r
        higher = self.answers[1].get("higher_is_better")
        return judge(r, higher if higher is not None else (r.unit in HIGHER_IS_BETTER if r.kind == "track" else None))


def worker_pairs(start_a, start_b, pairs: int = PAIRS):
    """(index, worker a, worker b) for ``pairs`` pairs of fresh workers.  The next pair is started while this one
    measures: a worker's start (importing torch, ~1.5 s of CPU) is most of a pair's cost, and its load falls on
    both sides of the rounds it overlaps alike, as any neighbour's does."""
    started = [(start_a(), start_b())]
    try:
        for p in range(pairs):
            if p + 1 < pairs:
                started.append((start_a(), start_b()))
            a, b = started[0]
            yield p, a, b
            for worker in started.pop(0):
                worker.close()
    finally:
        for worker in (w for pair in started for w in pair):
            worker.close()


def measure(start_a, start_b, matched, *, pairs: int = PAIRS, first_look: int = FIRST_LOOK, progress=print,
            **how) -> list[Result]:
    """Each (case_a, case_b) of ``matched`` (or of ``matched(a, b)``, asked of the first pair's workers) over
    ``pairs`` pairs of workers from start_a() and start_b(), every case in every pair: one Result each, B / A.
    From the ``first_look``-th pair on, the comparison stops once every case is `settled` (or cannot be measured):
    on a quiet machine, most comparisons of code that changed nothing, or that changed it by 5% or more, cost about
    half of theirs."""
    runs, started = None, time.perf_counter()
    with contextlib.closing(worker_pairs(start_a, start_b, pairs)) as each_pair:
        for p, a, b in each_pair:
            if runs is None:
                runs = [Rounds(*case, pairs=pairs, **how) for case in (matched(a, b) if callable(matched) else matched)]
            for run in runs:
                run.pair(a, b, p)
            if pairs > 1:
                progress(f"pair {p + 1}/{pairs}: {len(runs)} cases, {time.perf_counter() - started:.0f} s so far")
            if p + 1 >= first_look and all(run.problem is not None or settled(run.r) for run in runs):
                if p + 1 < pairs:
                    progress(f"every case settled after {p + 1} pairs: its interval within or beyond "
                             f"{MIN_EFFECT:.1%} of 1")
                break
    return [run.result() for run in runs or []]


# ------------------------------------------------------------------------------------------ comparisons
def compare_commits(base: str, head: str, bench: str, *, rounds: int = ROUNDS, pairs: int = PAIRS,
                    repo: Path = ROOT, clock: str = "cpu", threads: int = 1, progress=print) -> list[Result]:
    """Every case matching ``bench`` (asv's --bench syntax) at both commits: HEAD / BASE, one Result each."""
    (pa, sa), (pb, sb) = prepare(base, repo), prepare(head, repo)
    listed = {}

    def matched(a: Worker, b: Worker) -> list:
        listed["base"], listed["head"] = a.cases(bench), b.cases(bench)
        if not listed["base"] and not listed["head"]:  # known from the first pair's listing, before any round
            raise UsageError(f"--bench {bench!r}: no benchmark case matches it at {base} or at {head} "
                             "(`asv check` or benchmarks/ lists them; the syntax: module.Class.method(param, ...))")
        return [(case, case) for case in listed["head"] if case in listed["base"]]

    results = measure(lambda: Worker(pa, sa), lambda: Worker(pb, sb), matched, rounds=rounds, pairs=pairs,
                      clock=clock, threads=threads, progress=progress)
    for r in results:
        if r.verdict != "skipped":
            progress(line(r))
    return (results + [Result(*c, verdict="new", why="not at BASE") for c in listed["head"] if c not in listed["base"]]
            + [Result(*c, verdict="gone", why="not at HEAD") for c in listed["base"] if c not in listed["head"]])


def compare_impls(impl_a: str, impl_b: str, bench: str, *, commit: str = "HEAD", rounds: int = ROUNDS,
                  pairs: int = PAIRS, repo: Path = ROOT, clock: str = "cpu", threads: int = 1,
                  progress=print) -> list[Result]:
    """impl_b / impl_a on one commit: each case naming impl_a paired with the same case naming impl_b."""
    python, src = prepare(commit, repo)

    def matched(a: Worker, b: Worker) -> list:
        cases = set(a.cases(bench))
        pairs_of = [((name, params), (name, tuple(impl_b if p == impl_a else p for p in params)))
                    for name, params in sorted(cases, key=str) if impl_a in params]
        found = [(x, y) for x, y in pairs_of if y in cases]
        if not found:  # known from the first pair's listing, before any round
            named = sorted({p for _, params in cases for p in params if isinstance(p, str) and "_" in p})[:20]
            raise UsageError(f"--impls {impl_a} {impl_b}: no case of --bench {bench!r} names {impl_a!r} with a twin "
                             f"naming {impl_b!r} at {commit}" + (f"; its cases name {', '.join(named)}" if named else
                                                                  f"; --bench {bench!r} matches no case"))
        return found

    results = measure(lambda: Worker(python, src), lambda: Worker(python, src), matched, rounds=rounds, pairs=pairs,
                      clock=clock, threads=threads, progress=progress)
    for r in results:
        progress(line(r))
    return results


def line(r: Result) -> str:
    if math.isnan(r.ratio):
        return f"{r.verdict:>12}  {'':>24}  {r.label}  ({r.why[:100]})"
    return (f"{r.verdict:>12}  {r.ratio:7.3f} [{r.low:6.3f}, {r.high:6.3f}]  {r.label}  "
            f"({len(r.a)} rounds, {r.seconds:.0f} s)")


def table(results: list[Result], a: str, b: str) -> str:
    """One line per measured case; skipped ones (a cuda case without a GPU...) counted in one line, with why."""
    head = f"{'verdict':>12}  {b} / {a}, {CONFIDENCE:.0%} interval"
    skipped = [r for r in results if r.verdict == "skipped"]
    reasons = sorted({r.why.splitlines()[0][:80] for r in skipped})
    tail = [f"{len(skipped)} cases skipped here: {'; '.join(reasons)}"] if skipped else []
    return "\n".join([head, *(line(r) for r in results if r.verdict != "skipped"), *tail])


# ------------------------------------------------------------------------------------------ validation
def copies(fractions: list[float], repo: Path = ROOT, at: str = "HEAD") -> tuple[Path, str, dict[float, str]]:
    """A scratch clone of ``repo`` at ``at`` and, per fraction f, a commit on top of it whose
    llm_inference_harness.bench.calibrated.COST is 1 + f (f = 0: only a comment changes).  Commit dates are fixed, so
    the same HEAD gives the same copies (and their environments are reused)."""
    head = git(repo, "rev-parse", f"{at}^{{commit}}")
    scratch = ENVS / f"copies-{head[:12]}"
    if not (scratch / ".git").is_dir():
        shutil.rmtree(scratch, ignore_errors=True)
        git(repo, "clone", "-q", "--shared", "--no-checkout", str(repo), str(scratch))
    env = {**os.environ, "GIT_AUTHOR_NAME": "llm_inference_harness.bench.compare",
           "GIT_AUTHOR_EMAIL": "compare@invalid",
           "GIT_COMMITTER_NAME": "llm_inference_harness.bench.compare", "GIT_COMMITTER_EMAIL": "compare@invalid",
           "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}
    made = {}
    for f in fractions:
        git(scratch, "checkout", "-q", "--detach", "--force", head)
        path = scratch / "harness" / "bench" / "calibrated.py"
        text = path.read_text()
        new = re.sub(r"^COST = 1\.0\b", f"COST = {1 + f!r}" if f else "COST = 1.0  # a copy", text, count=1, flags=re.M)
        if new == text:
            raise RuntimeError("harness/bench/calibrated.py has no 'COST = 1.0' line to change")
        path.write_text(new)
        subprocess.run(["git", "commit", "-q", "-am", f"calibrated cost x{1 + f}"], cwd=scratch, env=env, check=True)
        made[f] = git(scratch, "rev-parse", "HEAD")
    return scratch, head, made


def power(fractions: list[float], comparisons: int, *, rounds: int = ROUNDS, pairs: int = PAIRS,
          out: Path | None = None, at: str = "HEAD") -> dict:
    """Compare the original with each copy ``comparisons`` times (a fraction listed twice: twice as often), the
    fractions taking turns so that the machine's load falls on all of them alike.  Per fraction: how often the
    verdict was ``slower`` / ``faster``, the ratios, the seconds per comparison (fresh worker pairs each time,
    environments already built), the load average and the time of each.  With ``out`` the tally is written after
    every turn, and a later run of the same design (copies, rounds, pairs, statistics, and this checkout's commit:
    the measuring code) goes on from it, so the measurement can be taken in chunks."""
    scratch, base, made = copies(fractions, at=at)
    for commit in [base, *made.values()]:
        prepare(commit, scratch)
    design = {"commit": base, "rounds": rounds, "pairs": pairs, "first_look": FIRST_LOOK, "confidence": CONFIDENCE,
              "min_effect": MIN_EFFECT, "noisy": NOISY, "measured_by": provenance.commit()}
    before = json.loads(out.read_text()) if out and out.is_file() else {}
    kept = before.get("fractions", {}) if before.get("design") == design else {}
    tally = {f: kept.get(str(f)) or {"slower": 0, "faster": 0, "n": 0, "verdicts": [], "ratios": [], "intervals": [],
                                     "pair_logs": [], "seconds": [], "load": [], "finished": []} for f in fractions}
    turn = {f: fractions.count(f) for f in fractions}  # a fraction listed twice is compared twice per turn
    for k in range(comparisons):
        for f in fractions:
            if tally[f]["n"] >= (k + 1) * turn[f]:  # measured before: a resumed run skips it
                continue
            started = time.perf_counter()
            (r,) = compare_commits(base, made[f], CALIBRATED, rounds=rounds, pairs=pairs, repo=scratch,
                                   progress=lambda _: None)
            _count(tally[f], r, time.perf_counter() - started)
            print(f"power {k + 1}/{comparisons} +{f:.0%}: {line(r)}  [{time.perf_counter() - started:.1f} s, "
                  f"load {os.getloadavg()[0]:.1f}]", flush=True)
        if out:
            outputs.write_json(out, {"design": design, "machine": provenance.machine_name(),
                                     "fractions": {str(f): t for f, t in tally.items()}})
    return tally


def _count(t: dict, r: Result, seconds: float) -> None:
    t["n"] += 1
    t["slower"] += r.verdict == "slower"
    t["faster"] += r.verdict == "faster"
    t["verdicts"].append(r.verdict)
    t["ratios"].append(r.ratio)
    t["intervals"].append([r.low, r.high])
    t["pair_logs"].append(r.pair_logs)
    t["seconds"].append(seconds)
    t["load"].append(os.getloadavg()[0])
    t["finished"].append(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


# ------------------------------------------------------------------------------------------ command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", nargs="?", default="main", help="the commit measured as A (default main)")
    p.add_argument("head", nargs="?", default="HEAD", help="the commit measured as B (default HEAD)")
    p.add_argument("--bench", metavar="PATTERN", help="cases matching this (asv --bench syntax: "
                   "module.Class.method(param, ...)); default: the quick pass's headline cases")
    p.add_argument("--impls", nargs=2, metavar=("A", "B"), help="instead of two commits: implementation B / A "
                   "on the commit HEAD names")
    p.add_argument("--rounds", type=int, default=ROUNDS, help=f"A/B rounds per case (default {ROUNDS})")
    p.add_argument("--pairs", type=int, default=PAIRS, help=f"fresh worker pairs the rounds are spread over "
                   f"(default {PAIRS}; the interval counts pairs: fewer than 8 cannot exclude 1)")
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu", help="how time_ cases are read: the "
                   "worker's CPU seconds (default; load from other processes does not inflate them) or wall seconds")
    p.add_argument("--threads", type=int, default=1, help="torch threads of time_ cases (default 1: on a shared "
                   "machine a second thread waits for its descheduled partner; 0: as each benchmark sets them)")
    p.add_argument("--json", metavar="FILE", help="also write every case's rounds and verdict as JSON")


def check_commit(name: str) -> str:
    """The commit ``name`` names in this checkout, or a UsageError saying it names none."""
    if provenance.checkout() is None:
        raise UsageError("comparing commits needs a git checkout of the harness (an installed wheel has no history)")
    found = None if not name.strip() or name.startswith("-") else subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"], cwd=ROOT, capture_output=True, text=True)
    if found is None or found.returncode:
        raise UsageError(f"no commit {name!r} in {ROOT} (a branch, tag or hash; `git log --oneline` lists them)")
    return found.stdout.strip()


def check_pattern(pattern: str | None) -> None:
    """A --bench pattern: a regular expression (asv's --bench syntax), or None for the default cases."""
    if pattern is None:
        return
    if not pattern.strip():
        raise UsageError("--bench: an empty pattern; expected a regular expression naming benchmark cases")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--bench {pattern!r}: not a regular expression ({exc})") from None


def validate(args: argparse.Namespace) -> None:
    """Every argument of a comparison, checked before any environment is built or worker started."""
    for flag, least in (("rounds", 1), ("pairs", 1), ("threads", 0)):
        if getattr(args, flag) < least:
            raise UsageError(f"--{flag} {getattr(args, flag)}: expected a whole number >= {least}")
    head = check_commit(args.head)
    if args.impls:
        from llm_inference_harness.engine.registry import REGISTRY, load_all

        load_all()
        known = {name for _, name in REGISTRY} if head == check_commit("HEAD") else None  # another commit: its own
        unknown = [name for name in args.impls if known is not None and name not in known]
        if unknown:
            import difflib

            near = difflib.get_close_matches(unknown[0], sorted(known), n=3)
            raise UsageError(f"--impls: no implementation {unknown[0]!r}" + (f" (did you mean {', '.join(near)}?)"
                             if near else "") + "; `harness list` shows every technique's")
    else:
        check_commit(args.base)
    check_pattern(args.bench)
    if args.json is not None:
        outputs.check_file(args.json, "--json")


def run(args: argparse.Namespace) -> int:
    from llm_inference_harness.bench.asvrun import QUICK, regex

    validate(args)
    bench = args.bench or regex(QUICK)
    if args.impls:
        a, b = args.impls
        results = compare_impls(a, b, bench, commit=args.head, rounds=args.rounds, pairs=args.pairs,
                                clock=args.clock, threads=args.threads)
    else:
        a, b = args.base, args.head
        results = compare_commits(a, b, bench, rounds=args.rounds, pairs=args.pairs, clock=args.clock,
                                  threads=args.threads)
    print(f"\nmachine {provenance.machine_name()}; {a} vs {b}\n" + table(results, a, b))
    if args.json:
        outputs.write_json(args.json, {"machine": provenance.machine_name(), "a": a, "b": b,
                                       "confidence": CONFIDENCE, "min_effect": MIN_EFFECT,
                                       "results": [asdict(r) | {"label": r.label} for r in results]})
    return 1 if any(r.verdict in WORSE for r in results) else 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_inference_harness.bench.compare",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--power", nargs="*", type=float, metavar="FRACTION",
                        help="validate instead: compare copies whose calibrated cost is raised by these fractions")
    parser.add_argument("--comparisons", type=int, default=40, help="with --power: comparisons per fraction")
    parser.add_argument("--at", default="HEAD", help="with --power: the commit to copy (default HEAD; an earlier "
                        "one reuses the environments its copies already have)")
    parser.add_argument("--out", type=Path, help="with --power: where to write the tally (default: "
                        "<output_root>/compare-power.json)")
    args = parser.parse_args()
    try:
        return _main(args)
    except UsageError as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")


def _main(args: argparse.Namespace) -> int:
    if args.power is not None:
        if args.out is None:
            provenance.output_root().mkdir(parents=True, exist_ok=True)
        out = outputs.check_file(args.out or provenance.output_root() / "compare-power.json", "--out")
        power(args.power or [0.0, 0.05, 0.10, 0.20], args.comparisons, rounds=args.rounds, pairs=args.pairs, out=out,
              at=args.at)
        print(f"power: {out}")
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
