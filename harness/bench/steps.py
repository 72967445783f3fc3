"""Steps in the committed history, checked by the A/B comparison: ``python -m llm_inference_harness.bench.steps``.

A history line moves for two reasons: the code changed, or the machine did (its load, a noisy benchmark).  `candidates`
finds where a line moves: at each commit of a series (one benchmark, machine, environment and parameter combination at
the benchmark's current version, commits in date order), the WINDOW values before and the WINDOW after differ by at
least MIN_STEP in their medians and a Mann-Whitney test separates them (p < ALPHA); of neighbouring candidates the
largest is kept.  `check` then runs `llm_inference_harness.bench.compare` on the two commits around each candidate, both
measured in one session on this machine, and records its verdict in results/steps.json; the dashboard marks the steps
the comparison called significant with their commit.  A candidate the comparison calls ``same`` or ``noisy`` was the
history's noise, not a change.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import time
from collections import defaultdict
from dataclasses import asdict, dataclass

from llm_inference_harness.bench import asvrun, compare
from llm_inference_harness.bench import results as results_paths
from llm_inference_harness.engine import outputs, provenance

WINDOW = 5  # values each side of a candidate: the fewest whose Mann-Whitney test can reach p < 0.01
MIN_STEP = 0.10  # the medians of the two windows differ by this fraction at least
ALPHA = 0.05


@dataclass(frozen=True)
class Candidate:
    benchmark: str
    machine: str
    params: tuple
    before: str  # the last commit of the old level
    after: str  # the first commit of the new one
    step: float  # median after / median before
    p_value: float


def series() -> dict[tuple, list[results_paths.Point]]:
    """{(benchmark, machine, env, params): points in commit-date order} of the committed results at each
    benchmark's current version."""
    suite = asvrun.suite()
    found: dict[tuple, dict[str, results_paths.Point]] = defaultdict(dict)
    for machine in results_paths.machines():
        for p in results_paths.points(results_paths.COMMITTED, machine):
            if p.benchmark in suite and p.version == suite[p.benchmark]["version"]:
                found[p.benchmark, machine, p.env, p.params].setdefault(p.commit, p)
    return {key: sorted(points.values(), key=lambda p: p.date) for key, points in found.items()}


def candidates(lines: dict[tuple, list[results_paths.Point]], window: int = WINDOW, min_step: float = MIN_STEP,
               alpha: float = ALPHA) -> list[Candidate]:
    """Where a line's level moves: see the module's docstring.  Largest step first."""
    from scipy.stats import mannwhitneyu

    found = []
    for (benchmark, machine, _, params), points in lines.items():
        values = [p.value for p in points]
        moves = []
        for i in range(window, len(points) - window + 1):
            before, after = values[i - window:i], values[i:i + window]
            step = statistics.median(after) / statistics.median(before)
            p_value = float(mannwhitneyu(before, after).pvalue)
            if abs(math.log(step)) >= math.log(1 + min_step) and p_value < alpha:
                moves.append((abs(math.log(step)), i, step, p_value))
        kept: list[int] = []
        for _, i, step, p_value in sorted(moves, reverse=True):  # the largest of neighbouring candidates
            if all(abs(i - j) >= window for j in kept):
                kept.append(i)
                found.append(Candidate(benchmark, machine, params, points[i - 1].commit, points[i].commit, step,
                                       p_value))
    return sorted(found, key=lambda c: -abs(math.log(c.step)))


def case_regex(benchmark: str, params: tuple) -> str:
    """asv's --bench syntax for exactly this case."""
    label = f"{benchmark}({', '.join(map(repr, params))})" if params else benchmark
    return f"^{re.escape(label)}$"


def check(found: list[Candidate], pairs: int = compare.PAIRS, limit: int | None = None) -> list[dict]:
    """Compare the two commits of each candidate not checked before (at most ``limit``), writing every verdict
    to results/steps.json as it comes; returns all the recorded steps."""
    recorded = recorded_steps()
    done = {_key(s) for s in recorded}
    todo = [c for c in found if _key(asdict(c)) not in done][:limit]
    for c in todo:
        started = time.perf_counter()
        (r,) = [x for x in compare.compare_commits(c.before, c.after, case_regex(c.benchmark, c.params), pairs=pairs)
                if x.verdict not in ("new", "gone")] or [compare.Result(c.benchmark, c.params, verdict="gone")]
        recorded.append({**asdict(c), "params": list(c.params), "compare": {
            "verdict": r.verdict, "ratio": r.ratio, "low": r.low, "high": r.high, "rounds": len(r.a), "pairs": pairs,
            "machine": provenance.machine_name(), "measured_by": provenance.commit(),
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "seconds": round(time.perf_counter() - started)}})
        outputs.write_json(results_paths.STEPS, {"version": 1, "steps": recorded})
        print(f"{c.before[:8]} -> {c.after[:8]}  {c.benchmark}{c.params} on {c.machine}: history x{c.step:.3f}; "
              f"compare {compare.line(r)}", flush=True)
    return recorded


def recorded_steps() -> list[dict]:
    """The steps checked so far (results/steps.json), [] before any."""
    import json

    path = results_paths.STEPS
    return json.loads(path.read_text())["steps"] if path.is_file() else []


def _key(step: dict) -> tuple:
    return step["benchmark"], step["machine"], tuple(step["params"]), step["before"], step["after"]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_inference_harness.bench.steps",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="only list the candidates, compare nothing")
    parser.add_argument("--limit", type=int, help="compare at most this many candidates not checked before")
    parser.add_argument("--pairs", type=int, default=compare.PAIRS, help="worker pairs per comparison")
    parser.add_argument("--min-step", type=float, default=MIN_STEP)
    args = parser.parse_args()
    found = candidates(series(), min_step=args.min_step)
    for c in found:
        print(f"candidate {c.before[:8]} -> {c.after[:8]}  x{c.step:.3f} (p {c.p_value:.3f})  {c.benchmark}"
              f"{c.params} on {c.machine}")
    if not args.list:
        check(found, args.pairs, args.limit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
