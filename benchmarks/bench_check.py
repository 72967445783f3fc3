"""Time to verdict: `harness check TECHNIQUE --plugin ...` for a plugin copy of a built-in implementation
(the example plugins of docs/examples/, which the README shows and the test suite checks), in the ci profile, as a
user runs it: a fresh process, one checking process (--jobs 1).  Goal: <= 30 s each on a 2-core machine."""

import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import require

ROOT = Path(__file__).resolve().parents[1]
TECHNIQUES = ["attention", "attention_backward", "block_manager", "kvcache", "paged_attention", "quantization",
              "quantized_linear", "speculative"]
CHECK = re.compile(r"harness check (\w+) --plugin (docs/examples/\w+\.py:\w+)")


def setup(*params):
    require("llm_inference_harness.engine.runner")


def example(technique: str) -> str:
    """The --plugin spec of the technique's example plugin, or NotImplementedError (asv: n/a) at a commit without."""
    for path in sorted((ROOT / "docs" / "examples").glob("*.py")):
        m = CHECK.search(path.read_text())
        if m and m.group(1) == technique:
            return m.group(2)
    raise NotImplementedError(f"no example plugin for {technique} at this commit")


class CheckPlugin:
    params = [TECHNIQUES]
    param_names = ["technique"]
    timeout = 900
    number, repeat = 1, 1

    def setup(self, technique):
        self.spec = example(technique)

    def track_check_seconds(self, technique):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "llm_inference_harness", "check", technique, "--plugin", self.spec,
                               "--jobs", "1"], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"check {technique} failed:\n{done.stdout[-2000:]}")
        return time.perf_counter() - start

    track_check_seconds.unit = "s"
