"""Plugins that try to forge their verdict get a failing one, naming what was seen (tests/adversarial/).

Each plugin is the same wrong attention (no causal mask, scale 1) plus one trick from the public record of gamed
kernel evaluators: patching the judge's reference, tolerances, comparisons, Hypothesis, the laws or builtins;
walking the stack for the answer; behaving only under test; a lying tensor subclass; aliasing, late writes,
pointer caches; mutating inputs; exiting; forging the result channel or files; a lingering thread; reading or
killing the judge.  All are checked in one `harness check` (ci profile, as a user runs it), each in a process of
its own; none may pass, and each failure must say what the judge saw.
"""

import json
import os
from pathlib import Path

import pytest

from llm_inference_harness.cli import main
from tests.shared import once

ADVERSARIAL = Path(__file__).with_name("adversarial")
REFERENCE = "vs float64 reference"
EXPECTED = {  # plugin -> what its FAIL must say (one of, where a tuple)
    "patches_reference": REFERENCE,
    "patches_tolerance": REFERENCE,
    "patches_comparisons": REFERENCE,
    "patches_hypothesis": REFERENCE,
    "patches_properties": REFERENCE,
    "patches_builtins": "raised",  # its own process cannot compute any more: the call raises there
    "walks_the_stack": REFERENCE,
    "behaves_under_test": REFERENCE,
    "tensor_subclass": REFERENCE,
    "aliases_an_input": "mutated its input q",
    "fills_output_later": REFERENCE,
    "caches_by_pointer": REFERENCE,
    "mutates_inputs": "mutated its input q",
    "exits_after_returning": "exited with code 0",
    "exits_inside_the_call": "raised SystemExit",
    "exits_at_exit": REFERENCE,
    "forges_the_channel": "mutated its input q",  # its writes through /proc/self/fd reach its view of the inputs
    "forges_result_files": REFERENCE,
    # its thread zeroes the inputs it holds from the moment its call stores them: before the call's result is sent
    # back (the judge sees a mutated input) or after (a write after the call had returned), as the scheduler has it
    "lingering_thread": ("mutated its input q", "after the call had returned"),
    "reads_judge_memory": REFERENCE,
    "kills_the_judge": REFERENCE if os.geteuid() == 0 else "crashed",  # as root it cannot signal the judge
}


def _spec(name: str) -> str:
    return f"{ADVERSARIAL / name}.py:attention"


def _check(tmp: Path, *extra: str) -> dict:
    out = tmp / "verdicts.json"
    args = ["check", "attention", "--property", "matches_reference", "--json", str(out), "--jobs", "2", *extra]
    for name in EXPECTED:
        args += ["--plugin", _spec(name)]
    assert main(args) == 1
    document = json.loads(out.read_text())
    targets = {i["name"]: i["target"] for i in document["implementations"]}
    return {Path(targets[v["impl"]].split(":")[0]).stem: v for v in document["verdicts"]}


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    return once(tmp_path_factory, "adversarial", _check)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_trick_gets_a_failing_verdict_naming_what_was_seen(isolated, name):
    verdict = isolated[name]
    assert verdict["status"] == "FAIL", f"{name} forged its verdict: {verdict}"
    says = EXPECTED[name] if isinstance(EXPECTED[name], tuple) else (EXPECTED[name],)
    assert any(s in verdict["message"] for s in says), f"{name}: {verdict['message'][:400]}"


def test_no_forged_file_is_left(isolated):
    """The plugin that writes verdict files where the judge would cannot write one (harness/engine/confine.py
    drops its process to a user of its own when the harness runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("the implementation's process runs as this user (not root): it can write what this user can")
    assert not Path("results/local/forged.json").exists()


def test_in_process_the_reference_can_be_patched(tmp_path):
    """What ``--trusted-in-process`` gives up: there the judge's reference lives in the plugin's process, and a
    plugin that patches it passes the law it breaks (the reason it is for one's own code only)."""
    out = tmp_path / "verdicts.json"
    try:
        rc = main(["check", "attention", "--property", "matches_reference", "--trusted-in-process", "--json",
                   str(out), "--plugin", _spec("patches_reference")])
    finally:
        os.environ.pop("HARNESS_TRUSTED_IN_PROCESS", None)
    assert rc == 0 and json.loads(out.read_text())["verdicts"][0]["status"] == "pass"


def test_a_kernel_wrong_only_at_benchmark_sizes_fails_its_benchmark():
    """No law at the sizes properties draw can tell (what no judge can promise, README's trust model); the output of
    a call at the benchmark's own size is checked before it is timed (benchmarks/common.py), and fails."""
    import torch

    from benchmarks.common import checked_at_scale
    from llm_inference_harness.engine.plugins import load_plugin

    fn = load_plugin(_spec("small_sizes_only"), "attention").fn  # its own code, run here: this is about the check
    small = torch.randn(1, 2, 32, 16)
    checked_at_scale(fn, small, small, small, causal=True)  # right where it is small
    q = torch.randn(1, 2, 512, 16)
    with pytest.raises(AssertionError, match="at benchmark size"):
        checked_at_scale(fn, q, q, q, causal=True)
