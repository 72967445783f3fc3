"""asv, run so that it never touches tracked files: the main job's quick pass, the full sweep, and the gate.

Every asv call goes through a temporary configuration (results and html under ``provenance.output_root()``,
results/local in a checkout) and a temporary machine file describing this hardware under its own name
(``provenance.asv_machine()``), so neither results/benchmarks.json, results/<machine>/ nor ~/.asv-machine.json
is written.  After a run, `history.normalize` gives the new result files the environment identity the
committed ones have (the interpreter's version, not its path), so one machine's results form one series.

    python -m harness.quickbench quick     # QUICK: the headline ratios, <= 3 min on 2 shared cores
    python -m harness.quickbench full      # every benchmark, asv --quick: FULL_SWEEP_MINUTES
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import provenance

ROOT = provenance.ROOT

# The main job's pass: the headline ratios, each case chosen to answer one question in seconds.  Measured on
# xeon-amx-2c-24g (2 shared cores), asv --quick, forkserver: the seconds each took there.  A cuda case (the
# same regex) is measured on a GPU machine and skipped (n/a) in under a second elsewhere.
CPU_OR_CUDA = "'(cpu|cuda)'"
QUICK: dict[str, str] = {
    # best tiled kernel / SDPA at N=2048, one CPU thread (two threads on two shared cores measure the
    # neighbours' load), all of a GPU (the goal <= 1.0)                                          ~35 s
    "bench_attention.SdpaRatio.track_best_tiled_over_sdpa": r"\(('cpu', '1'|'cuda', 'all')\)",
    # Triton FlashAttention-2 / SDPA TFLOP/s at the paper's shapes (CUDA only; n/a here)          ~1 s
    "bench_attention.KernelTflops.track_tflops": r"\(.*, 'cuda', 4096, 128, True\)",
    # recompute / cached generation at n = 512, d = 256 (goal >= 10x)                             ~35 s
    "bench_kvcache.CachedVsRecompute.track_recompute_over_cached": rf"\('concat', {CPU_OR_CUDA}, 512, 256\)",
    # batch-1 decode bandwidth / matvec bandwidth of a 403M-parameter model (goal >= 0.85)        ~25 s
    "bench_kvcache.MemoryRoofline.track_fraction_of_matvec_bandwidth": rf"\('concat', {CPU_OR_CUDA}\)",
    # paged decode attention / SDPA on the same K/V, cache 1024 (goal <= 1.25)                    ~10 s
    "bench_paging.PagedDecodeAttention.track_paged_over_contiguous": rf"\(.*, {CPU_OR_CUDA}, 1024\)",
    # exact enumeration of a vocabulary-4 pair, gamma 3, T 4 (goal <= 1 s)                         ~5 s
    "bench_speculative.Enumeration.time_vocab4_gamma3_T4": r"\('standard', 'cpu'\)",
    # serving simulator, paged vs reserve-max throughput (deterministic)                          ~15 s
    "bench_paging.ServingSimulator.track_throughput_vs_reserve_max": r"\('paged16', '(a|b)'\)",
}
FULL_SWEEP_MINUTES = "about 150"  # every benchmark, asv --quick, on xeon-amx-2c-24g (measured: docs/benchmarks.md)


def regex(cases: dict[str, str]) -> str:
    """One asv --bench regex selecting the given {benchmark: parameter regex} cases."""
    return "|".join(f"^{name.replace('.', chr(92) + '.')}{params}" for name, params in cases.items())


def local_results() -> Path:
    """asv results of this machine's runs: ignored, under output_root() (never results/<committed machine>/)."""
    return provenance.output_root() / "asv"


_ASV_MAIN = ("import sys, asv.machine as m; path = sys.argv.pop(1); "
             "m.MachineCollection.get_machine_file_path = staticmethod(lambda: path); "
             "from asv.main import main; sys.argv[0] = 'asv'; sys.exit(main())")


def asv(args: list[str], *, results: Path, html: Path | None = None, nice: int = 0, **config) -> int:
    """``asv ARGS`` with a temporary configuration (results_dir ``results``, html_dir ``html``, ``config``
    overriding asv.conf.json) and a temporary machine file holding this machine, named by its hardware."""
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), env_dir=str(ROOT / ".asv" / "env"),
                results_dir=str(results), html_dir=str(html or results.parent / "html"), **config)
    machine = provenance.asv_machine()
    with tempfile.TemporaryDirectory(prefix="harness-asv-") as tmp:
        (Path(tmp) / "asv.conf.json").write_text(json.dumps(conf, indent=2))
        (Path(tmp) / "machine.json").write_text(json.dumps({machine["machine"]: machine, "version": 1}))
        cmd = [sys.executable, "-c", _ASV_MAIN, str(Path(tmp) / "machine.json"), *args,
               "--config", str(Path(tmp) / "asv.conf.json")]
        if args[0] in ("run", "continuous"):
            cmd += ["--machine", machine["machine"]]
        return subprocess.run(["nice", "-n", str(nice), *cmd] if nice else cmd, cwd=ROOT).returncode


def run_quick(bench: str | None = None, *, full: bool = False) -> int:
    """asv --quick of the installed code (QUICK, or every benchmark when ``full``) into local_results(), then
    the dashboard of this machine's and the committed results in output_root()/html."""
    from harness import history
    from harness.dashboard import publish

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
    if not full:
        cmd += ["--bench", bench or regex(QUICK)]
    started = time.perf_counter()
    print(f"asv results: {local_results() / provenance.machine_name()} (commit {provenance.commit()})", flush=True)
    rc = asv(cmd, results=local_results())
    print(f"asv: {time.perf_counter() - started:.0f} s", flush=True)
    history.normalize(local_results())
    html = provenance.output_root() / "html"
    publish(html, [history.RESULTS, local_results()])
    print(f"dashboard: {html / 'index.html'}  (this machine's results and the committed ones; "
          f"serve: python -m harness.dashboard --out {html} --results {local_results()} --serve)")
    return rc


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def gate(base: str, head: str = "HEAD", bench: str | None = None) -> int:
    """The regression gate: HEAD against BASE by `harness.compare` (interleaved A/B rounds in one session,
    a confidence interval per benchmark); exit 1 when a benchmark is slower (worse), 0 otherwise."""
    from harness import compare

    results = compare.compare_commits(base, head, bench or regex(QUICK))
    print(compare.table(results, base, head))
    return 1 if any(r.verdict in compare.WORSE for r in results) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["quick", "full"], help="QUICK (the headline ratios) or every benchmark")
    parser.add_argument("--bench", metavar="REGEX", help="instead of QUICK: the benchmarks matching REGEX")
    args = parser.parse_args()
    return run_quick(args.bench, full=args.what == "full")


if __name__ == "__main__":
    raise SystemExit(main())
