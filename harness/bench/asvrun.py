"""asv, run so that it never touches tracked files, and the benchmark cases the harness runs by name.

Every asv call goes through a temporary configuration (results and html where the caller says: the paths of
llm_inference_harness.bench.results) and a temporary home holding a machine file that describes this hardware under its
own name (``provenance.asv_machine()``), so neither results/<machine>/ nor ~/.asv-machine.json is written unless a
caller points asv there on purpose (the history backfill).

asv writes its result files itself, in place (asv.util.write_json: open, truncate, dump), so a run killed mid-write
would leave a partial <commit>-<env>.json that every later report, dashboard and history rejects.  So asv never
writes where the results are kept: each call gets a staging folder beside the results folder (`staged`: same
filesystem, a name no reader globs), holding copies of what asv reads back from there (this machine's machine.json
and result files: asv merges a run into the commit's existing file).  When asv ends, every file it wrote or changed
that parses whole (a torn JSON document never does: asv killed mid-write leaves a file that is not kept, and is
named) is moved into the results folder with os.replace (llm_inference_harness.engine.outputs.move), and the staging
folder is removed.  A harness killed while asv runs leaves the results folder as it was; its staging folder, whose
name holds the harness's pid, is removed by the next call once that process is gone.  What the killed run measured is
lost, as it would be with asv alone (asv saves a commit's results once, when that commit is done).

QUICK is the main job's quick pass (the headline ratios; llm_inference_harness.bench.history's backfill measures the
same cases over main's history), GATE the regression gate's cases (fast ``time_`` benchmarks, one per technique).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from llm_inference_harness.bench import results as results_paths
from llm_inference_harness.engine import inputs, outputs, provenance

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
    # exact enumeration of the V = 8 sampling parameter grid, rejection sampler (goal <= 10 s)      ~5 s
    "bench_sampling.EnumerationGrid.track_seconds": r"\('rejection'\)",
    # serving simulator, paged vs reserve-max throughput (deterministic)                          ~15 s
    "bench_paging.ServingSimulator.track_throughput_vs_reserve_max": r"\('paged16', '(a|b)'\)",
}

@dataclass(frozen=True)
class Goal:
    """A headline benchmark's goal (docs/benchmarks.md): the value, the side of it that meets the goal, and the
    parameter values of the cases it is set for (empty: every case)."""

    value: float
    better: str  # "above" or "below"
    where: tuple[tuple[str, object], ...] = ()

    def applies(self, params: dict) -> bool:
        return all(params.get(name) == value for name, value in self.where)

    def met(self, value: float) -> bool:
        return value >= self.value if self.better == "above" else value <= self.value


GOALS: dict[str, Goal] = {
    "bench_attention.SdpaRatio.track_best_tiled_over_sdpa": Goal(1.0, "below"),
    "bench_kvcache.CachedVsRecompute.track_recompute_over_cached": Goal(10.0, "above", (("n", 512),)),
    "bench_kvcache.MemoryRoofline.track_fraction_of_matvec_bandwidth": Goal(0.85, "above"),
    "bench_paging.PagedDecodeAttention.track_paged_over_contiguous": Goal(1.25, "below"),
    "bench_speculative.Enumeration.time_vocab4_gamma3_T4": Goal(1.0, "below"),
}

# The regression gate: fast time_ cases of every technique's main kernels, each measured in ~0.1 s samples
# (llm_inference_harness.bench.compare: 30 A/B rounds each, about 10 s a case here).
GATE: dict[str, str] = {
    "bench_attention.AttentionForward.time_forward":
        rf"\('(sdpa|naive|fa2_64x64|fa2_optimistic_128x256|fa1_64x64)', {CPU_OR_CUDA}, '1x8x512x64', True\)",
    "bench_attention.AttentionDecode.time_decode": rf"\('(sdpa|splitk_decode_32)', {CPU_OR_CUDA}, 4096\)",
    "bench_attention_backward.AttentionBackward.time_forward_backward": rf"\('(naive|fa2_64x64)', {CPU_OR_CUDA}, 512\)",
    "bench_kvcache.PrefillVsDecode.time_decode_256": rf"\('(concat|static|paged)', {CPU_OR_CUDA}\)",
    "bench_paging.PagedDecodeAttention.time_paged_decode": rf"\(.*, {CPU_OR_CUDA}, 1024\)",
    "bench_quantization.LinearTime.time_matmul":
        rf"\('(float|w8a8_token|weight_only_g32|llm_int8)', {CPU_OR_CUDA}, 16\)",
    "bench_speculative.Enumeration.time_vocab4_gamma3_T4": r"\('standard', 'cpu'\)",
    "bench_speculative.WallClock.time_speculative": r"\('draft_good', 4, 'cpu'\)",
}
# Every benchmark but the validation of llm_inference_harness.bench.compare itself (tens of minutes:
# docs/benchmarks.md).
FULL = r"^(?!bench_harness\.ComparisonPower)"


def regex(cases: dict[str, str]) -> str:
    """One asv --bench regex selecting the given {benchmark: parameter regex} cases."""
    return "|".join(f"^{name.replace('.', chr(92) + '.')}{params}" for name, params in cases.items())


def local_results() -> Path:
    """asv results of this machine's runs (llm_inference_harness.bench.results.local())."""
    return results_paths.local()


def asv(args: list[str], *, results: Path, html: Path | None = None, nice: int = 0, log: Path | None = None,
        **config) -> int:
    """``asv ARGS`` with a temporary configuration (results_dir ``results``, html_dir ``html``, ``config``
    overriding asv.conf.json) and this machine, named by its hardware, as the only one asv knows.

    asv keeps its machines in ~/.asv-machine.json (asv's docs, "Machine information"); asv runs here with a
    temporary HOME holding this machine's file, so the user's is never read or written.  The caches under the
    real home (pip, Triton's compiled kernels) stay where they are."""
    machine = provenance.asv_machine()
    with staged(results, machine["machine"]) as staging:
        return _asv(args, staging, html or results.parent / "html", machine, nice, log, config)


def _asv(args: list[str], results: Path, html: Path, machine: dict, nice: int, log: Path | None,
         config: dict) -> int:
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), env_dir=str(ROOT / ".asv" / "env"),
                results_dir=str(results), html_dir=str(html), **config)
    real_home = Path.home()
    with tempfile.TemporaryDirectory(prefix="harness-asv-") as home:
        (Path(home) / "asv.conf.json").write_text(json.dumps(conf, indent=2))
        (Path(home) / ".asv-machine.json").write_text(json.dumps({machine["machine"]: machine, "version": 1}))
        env = {"XDG_CACHE_HOME": str(real_home / ".cache"), "XDG_CONFIG_HOME": str(real_home / ".config"),
               "TRITON_CACHE_DIR": str(real_home / ".triton" / "cache"), **os.environ, "HOME": home}
        cmd = [sys.executable, "-m", "asv", *args, "--config", str(Path(home) / "asv.conf.json")]
        if args[0] in ("run", "continuous"):
            cmd += ["--machine", machine["machine"]]
        with open(log, "w") if log else contextlib.nullcontext() as out:  # ``log``: its output there, not here
            return subprocess.run(["nice", "-n", str(nice), *cmd] if nice else cmd, cwd=ROOT, env=env, stdout=out,
                                  stderr=subprocess.STDOUT if log else None).returncode


STAGING = ".{name}.asv-staging-{pid}-"  # beside the results folder: what asv writes, until it is whole


@contextlib.contextmanager
def staged(results: Path, machine: str) -> Iterator[Path]:
    """A folder for asv to write ``results`` into (see the module's docstring): beside it, holding copies of its
    benchmarks.json and ``machine``'s files; when the block ends, however it ends, each file asv wrote or changed
    there that parses whole is moved into ``results``, and the folder is removed."""
    results.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(results)
    stage = Path(tempfile.mkdtemp(prefix=STAGING.format(name=results.name, pid=os.getpid()), dir=results.parent))
    try:
        for source in [results / "benchmarks.json", *sorted((results / machine).glob("*.json"))]:
            if source.is_file():
                (stage / source.relative_to(results)).parent.mkdir(exist_ok=True)
                shutil.copy2(source, stage / source.relative_to(results))
        before = {p: _signature(p) for p in stage.rglob("*") if p.is_file()}
        try:
            yield stage
        finally:
            torn = []
            for path in sorted(p for p in stage.rglob("*") if p.is_file()):
                if before.get(path) == _signature(path):
                    continue
                try:
                    inputs.read_json(path, "a JSON document written by asv")
                except inputs.BadFile as exc:
                    torn.append(str(exc))
                    continue
                outputs.move(path, results / path.relative_to(stage))
            if torn:
                print(f"asv left files that are not whole; not kept: {'; '.join(torn)}", file=sys.stderr)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _signature(path: Path) -> tuple[int, int]:
    status = path.stat()
    return status.st_size, status.st_mtime_ns


def _remove_abandoned(results: Path) -> None:
    """The staging folders of runs of ``results`` whose harness process is gone (killed mid-run)."""
    prefix = STAGING.format(name=results.name, pid="").removesuffix("-")
    for folder in results.parent.glob(f"{prefix}*"):
        pid = folder.name.removeprefix(prefix).partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def suite(refresh: bool = False) -> dict:
    """asv's description of this checkout's benchmark suite (benchmarks.json: names, parameter grids, versions),
    discovered by asv (~5 s) into results_paths.suite_file() unless it was already discovered at this clean
    commit.  Never committed: it is a function of the code."""
    path, stamp = results_paths.suite_file(), results_paths.suite_file().with_suffix(".commit")
    here = _code_stamp()
    current = here != "unknown" and path.is_file() and stamp.is_file() and stamp.read_text() == here
    if refresh or not current:
        with tempfile.TemporaryDirectory(prefix="harness-discover-") as tmp:
            # selecting no benchmark, asv discovers the suite, writes benchmarks.json, runs nothing and exits 1
            log = Path(tmp) / "discover.log"  # asv's lines about selecting nothing are noise: quoted on failure only
            rc = asv(["run", "--quick", "--python=same", "--dry-run", "--bench", "^no benchmark is called this$"]
                     + (["--set-commit-hash", _head()] if _head() else []), results=Path(tmp), log=log)
            found = Path(tmp) / "benchmarks.json"
            if not found.is_file():
                raise RuntimeError(f"asv could not discover the benchmark suite (exit {rc}):\n"
                                   f"{log.read_text()[-3000:]}")
            path.parent.mkdir(parents=True, exist_ok=True)
            outputs.write_bytes(path, found.read_bytes())
        outputs.write_text(stamp, here)  # after the suite: a run killed between leaves the old stamp (rediscovered)
    return inputs.asv_benchmarks(path)


def _code_stamp() -> str:
    """The checkout's commit, with a hash of its uncommitted changes to tracked files."""
    here = provenance.commit()
    if here.endswith("+dirty"):
        diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=ROOT, capture_output=True).stdout
        here += hashlib.sha1(diff).hexdigest()[:12]
    return here


def _head() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""
