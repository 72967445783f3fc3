"""The main job's quick benchmark pass, the full sweep, and the regression gate.

The quick pass (asvrun.QUICK: the headline ratios, about 2 minutes on 2 shared cores) and the full sweep (every
benchmark, asv --quick: docs/benchmarks.md has its duration) measure the installed code through asv into this machine's
ignored results folder (llm_inference_harness.bench.results.local(): results/local/asv/<machine>/), then publish the
dashboard of those and the committed results into results/local/html (llm_inference_harness.bench.results.html()).
After a run, `history.normalize` gives the new result files the environment identity the committed ones have (the
interpreter's version, not its path), so one machine's results form one series.

    python -m llm_inference_harness.bench.quickbench quick     # what `harness run` runs
    python -m llm_inference_harness.bench.quickbench full      # every benchmark
"""

from __future__ import annotations

import argparse
import subprocess
import time

from llm_inference_harness.bench import results as results_paths
from llm_inference_harness.bench.asvrun import FULL, GATE, QUICK, ROOT, asv, local_results, regex
from llm_inference_harness.engine import environment, outputs, provenance


def run_quick(bench: str | None = None, *, full: bool = False, quiet: bool = False) -> int:
    """asv --quick of the installed code (QUICK, or every benchmark when ``full``) into local_results(), then
    the dashboard of this machine's and the committed results in output_root()/html.  ``quiet`` (`harness run`):
    asv's output goes to a log file beside its results, quoted here only where asv fails."""
    from llm_inference_harness.bench import history
    from llm_inference_harness.bench.dashboard import publish

    if not (ROOT / "asv.conf.json").is_file():
        print("quick benchmarks: asv.conf.json not found (run from a checkout of the repository)")
        return 1
    if not _has_module("asv"):
        print("quick benchmarks: asv is not installed; pip install -e '.[bench]'")
        return 1
    commit = provenance.commit().removesuffix("+dirty")
    cmd = ["run", "--quick", "--python=same", "--show-stderr", "--launch-method", "forkserver"]
    if commit != "unknown":
        cmd += ["--set-commit-hash", _git("rev-parse", commit)]
    cmd += ["--bench", bench or (FULL if full else regex(QUICK))]
    started = time.perf_counter()
    print(f"asv results: {local_results() / provenance.machine_name()} (commit {provenance.commit()})", flush=True)
    log = local_results().parent / "asv-run.log" if quiet else None  # beside asv/, in the run's results
    rc = asv(cmd, results=local_results(), log=log)
    print(f"asv: {time.perf_counter() - started:.0f} s" + (f", its output in {log}" if log else ""), flush=True)
    if log and rc != 0:
        print(*log.read_text().splitlines()[-40:], sep="\n", flush=True)
    history.normalize(local_results())
    html = results_paths.html()
    publish(html, [results_paths.COMMITTED, local_results()], log=log)
    print(f"dashboard: {html / 'index.html'}  (this machine's results and the committed ones; "
          f"serve: python -m http.server 8080 --bind 127.0.0.1 --directory {html})")
    return rc


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def gate(base: str, head: str = "HEAD", bench: str | None = None) -> int:
    """The regression gate: HEAD against BASE by `llm_inference_harness.bench.compare` (interleaved A/B rounds in one
    session, a confidence interval per benchmark); exit 1 when a benchmark is slower (worse), 0 otherwise."""
    from llm_inference_harness.bench import compare

    compare.check_commit(base)
    compare.check_commit(head)
    compare.check_pattern(bench)
    results = compare.compare_commits(base, head, bench or regex(GATE))
    print(compare.table(results, base, head))
    return 1 if any(r.verdict in compare.WORSE for r in results) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["quick", "full"], help="QUICK (the headline ratios) or every benchmark")
    parser.add_argument("--bench", metavar="REGEX", help="instead of QUICK: the benchmarks matching REGEX")
    args = parser.parse_args()
    from llm_inference_harness.bench.compare import check_pattern
    from llm_inference_harness.engine.inputs import UsageError

    try:
        environment.check()
        check_pattern(args.bench)
        outputs.check_folder(provenance.output_root(), "the results folder", parents=True)
        return run_quick(args.bench, full=args.what == "full")
    except UsageError as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")


if __name__ == "__main__":
    raise SystemExit(main())
