"""The main job's quick benchmark pass: asv ``--quick`` on the installed code, then the offline dashboard.

Results land in results/<machine>/ under the current commit and the dashboard in results/html.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from harness.dashboard import publish

ROOT = Path(__file__).resolve().parents[1]


# The main job's pass: one benchmark class or more per technique, the ones that run in well under two
# minutes here (measured).  The whole suite (`asv run --quick ...` without --bench) takes much longer.
QUICK = "^(" + "|".join([
    r"bench_attention\.(SdpaRatio|ModelledHBMTraffic)",
    r"bench_attention_backward\.AttentionBackward\.track_backward_peak_memory",
    r"bench_kvcache\.(PrefillVsDecode|CachedVsRecompute|MemoryRoofline)",
    r"bench_paging\.(ServingSimulator|PagedDecodeAttention\.track_paged_over_contiguous)",
    r"bench_quantization\.QuantizerError",
    r"bench_speculative\.Enumeration\.time_vocab4",
]) + ")"


def run_quick(bench: str | None = QUICK) -> int:
    if not (ROOT / "asv.conf.json").is_file():
        print("quick benchmarks: asv.conf.json not found (run from a checkout of the repository)")
        return 1
    if shutil.which("asv") is None and not _has_module("asv"):
        print("quick benchmarks: asv is not installed; pip install -e '.[bench]'")
        return 1
    asv = [sys.executable, "-m", "asv"]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if not (Path.home() / ".asv-machine.json").exists():
        subprocess.run([*asv, "machine", "--yes"], cwd=ROOT, check=False)
    cmd = [*asv, "run", "--quick", "--python=same", "--show-stderr", "--launch-method", "forkserver"]
    if commit:
        cmd += ["--set-commit-hash", commit]
    if bench:
        cmd += ["--bench", bench]
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    publish()
    print(f"dashboard: {ROOT / 'results' / 'html' / 'index.html'}  (view: python -m harness.dashboard --serve)")
    return rc


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


GATE_FACTOR = 1.5  # back-to-back runs of one benchmark drifted ~30% on the shared 2-core VM (shared/notes/asv.md)


def gate(base: str, head: str, bench: str | None = None, factor: float = GATE_FACTOR) -> int:
    """The regression gate: ``asv continuous`` between two commits; non-zero exit when HEAD is slower by ``factor``."""
    cmd = [sys.executable, "-m", "asv", "continuous", "--factor", str(factor), "--split", "--show-stderr", base, head]
    if bench:
        cmd += ["--bench", bench]
    return subprocess.run(cmd, cwd=ROOT).returncode
