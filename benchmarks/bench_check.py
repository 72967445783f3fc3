"""Time to verdict: `harness check TECHNIQUE --plugin ...` for a plugin copy of a built-in implementation
(the example plugins of docs/examples/, which the README shows and the test suite checks), in the ci profile, as a
user runs it: a fresh process, one checking process (--jobs 1).  Goal: <= 30 s each on a 2-core machine.  And what
judging from outside the implementation's process costs: the same check isolated over in-process."""

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import require

ROOT = Path(__file__).resolve().parents[1]
TECHNIQUES = ["attention", "attention_backward", "block_manager", "kvcache", "paged_attention", "quantization",
              "quantized_linear", "speculative"]
CHECKED = [*TECHNIQUES, "sampling"]  # `harness check` of each technique's registered implementations
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


class IsolationCost:
    """`harness check TECHNIQUE --jobs 2` (every registered implementation of the technique, ci profile) with the
    judge isolated -- the default: each implementation in a process of its own, judged from outside
    (harness/engine/boundary.py) -- over the same check with --trusted-in-process.  Both back to back, the order
    flipped from one round to the next, the median of the rounds' ratios: load that comes and goes hits both sides
    of a round.  Goal: <= 1.5x.  A round whose two checks give different verdicts fails the benchmark: a ratio of
    unlike checks means nothing (and honest implementations must get the same verdicts both ways)."""

    params = [CHECKED]
    param_names = ["technique"]
    timeout = 3600
    number, repeat = 1, 1
    rounds = 2

    def track_isolated_over_in_process(self, technique):
        ratios = []
        for i in range(self.rounds):
            modes = ("isolated", "in_process")[:: 1 if i % 2 == 0 else -1]
            timed = {mode: checked(technique, mode) for mode in modes}
            (iso, iso_verdicts), (here, here_verdicts) = timed["isolated"], timed["in_process"]
            if iso_verdicts != here_verdicts:
                changed = sorted(k for k in iso_verdicts if iso_verdicts[k] != here_verdicts.get(k))
                raise RuntimeError(f"check {technique}: verdicts differ isolated and in-process: {changed[:5]}")
            ratios.append(iso / here)
        return statistics.median(ratios)

    track_isolated_over_in_process.unit = "ratio"


class MachineRequests:
    """The requests a block-manager state machine sends to the implementation's process in the ci profile, each a
    round trip: what IsolationCost's block_manager ratio is made of (the machines are ~85% of that check), counted,
    not timed.  A request costs ~54 us bare plus its answers' (~22 a request, 2-10 us each), so a count that falls
    says fewer round trips, not by itself less time (README, trust model).  The ci profile is derandomized, so the
    count repeats exactly where the ratio moves by 1.3-1.7x with load on one commit: a change to the machine or to
    `Observed` (harness/contracts/block_manager.py) shows here at once."""

    params = [["simple", "vllm_style"], ["machine_bookkeeping", "machine_data"]]
    param_names = ["implementation", "prop"]
    timeout = 900
    number, repeat = 1, 1

    def setup(self, implementation, prop):
        from llm_inference_harness.engine.profiles import load
        from llm_inference_harness.engine.runner import Target, open_isolated, properties_of, select

        load("ci")
        self.prop = select(properties_of("block_manager"), [prop])[0]
        self.impl = open_isolated(Target("block_manager", name=implementation), one_thread=True)
        if not hasattr(self.impl.fn.process, "requests"):
            self.teardown(implementation, prop)
            raise NotImplementedError("requests are not counted at this commit")

    def teardown(self, implementation, prop):
        self.impl.fn.process.close()

    def track_requests(self, implementation, prop):
        from llm_inference_harness.engine.runner import run_property

        verdict = run_property(self.prop, self.impl, profile="ci")
        if verdict.status != "pass":
            raise RuntimeError(f"{prop} of {implementation}: {verdict.status}: {verdict.message}")
        return self.impl.fn.process.requests

    track_requests.unit = "requests"


def checked(technique: str, mode: str) -> tuple[float, dict]:
    """(seconds, {(implementation, property): status}) of `harness check TECHNIQUE --jobs 2`, run ``mode``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "verdicts.json"
        command = [sys.executable, "-m", "llm_inference_harness", "check", technique, "--jobs", "2", "--json",
                   str(out)] + (["--trusted-in-process"] if mode == "in_process" else [])
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"check {technique} ({mode}) failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        verdicts = json.loads(out.read_text())["verdicts"]
    return seconds, {(v["impl"], v["property"]): v["status"] for v in verdicts}
