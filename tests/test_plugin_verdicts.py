"""A plugin that raises, hangs, crashes its process, returns NaN, zeros or the wrong shape, or mutates its
inputs gets a verdict that says which, with a line to reproduce it, and the run goes on to the next.

Runs `python -m harness check` as a user would, on tests/misbehaving_plugins.py: eight attention
plugins in one run, then one plugin for each other technique."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGINS = Path(__file__).with_name("misbehaving_plugins.py")
EXPECTED = {  # attention plugin -> (status, what its message must say)
    "correct": ("pass", ""),
    "raises": ("FAIL", "raised RuntimeError: boom"),
    "hangs": ("FAIL", "hung: no result within the per-call limit of 1 s"),
    "crashes": ("FAIL", "crashed: the checking process died with exit code 3"),
    "nan": ("FAIL", "returned a non-finite value"),
    "zeros": ("FAIL", "zeros vs float64 reference: max error"),
    "wrong_shape": ("FAIL", "returned shape (1, 1, 1, 1), expected (1, 1, 1, 3)"),
    "mutates": ("FAIL", "mutated its input k"),
}
OTHERS = {  # technique -> (plugin, the property run, what its message must say)
    "attention_backward": ("backward_two_gradients", "matches_reference",
                           "returned a tuple of 2, expected a tuple (dq, dk, dv)"),
    "paged_attention": ("paged_advances_seq_lens", "matches_contiguous_attention", "mutated its input seq_lens"),
    "kvcache": ("KVStepHangs", "prefill_then_steps_equal_forward", "hung: no result within the per-call limit of 1 s"),
    "block_manager": ("BlockManagerKeepsTokens", "machine_bookkeeping", "the manager kept the caller's list"),
    "quantization": ("quantization_nan_scale", "all_zero_groups_give_zeros", "scale: returned a non-finite value"),
    "quantized_linear": ("linear_transposed", "matches_scheme_reference", "output: returned shape"),
    "speculative": ("speculative_extends_prompt", "matches_target_distribution",
                    "mutated its input prompt: [0] became"),
}


def check(technique: str, plugins: list[str], prop: str, tmp_path: Path) -> dict[str, dict]:
    """`python -m harness check` on these plugins; its verdicts by implementation (it must exit 1: one failed)."""
    out = tmp_path / "verdicts.json"
    args = [arg for name in plugins for arg in ("--plugin", f"{PLUGINS}:{name}")]
    proc = subprocess.run([sys.executable, "-m", "harness", "check", technique, *args, "--property", prop,
                           "--profile", "ci", "--jobs", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=PLUGINS.parent.parent,
                          env={**os.environ, "HARNESS_PER_IMPL_LIMIT_S": "300"})
    assert proc.returncode == 1, f"exit {proc.returncode} (expected 1: plugins failed)\n{proc.stderr[-2000:]}"
    return {v["impl"]: v for v in json.loads(out.read_text())["verdicts"]}


def assert_verdict(v: dict, status: str, says: str, technique: str, prop: str) -> None:
    assert (v["status"], says in v["message"]) == (status, True), f"{v['impl']}: {v['status']} '{v['message']}'"
    if status == "FAIL":
        line = f"check {technique} --plugin {PLUGINS}:{v['impl']} --property {prop}"
        assert line in v["reproduce"], f"{v['impl']}: reproduce line '{v['reproduce']}'"


def test_each_misbehaving_plugin_gets_its_own_verdict(tmp_path):
    verdicts = check("attention", list(EXPECTED), "matches_reference", tmp_path)
    assert sorted(verdicts) == sorted(EXPECTED), f"verdicts for {sorted(verdicts)}, expected one per plugin"
    for name, (status, says) in EXPECTED.items():
        assert_verdict(verdicts[name], status, says, "attention", "matches_reference")


@pytest.mark.parametrize("technique", sorted(OTHERS))
def test_every_technique_reports_a_misbehaving_plugin(technique, tmp_path):
    plugin, prop, says = OTHERS[technique]
    verdicts = check(technique, [plugin], prop, tmp_path)
    assert sorted(verdicts) == [plugin], f"verdicts for {sorted(verdicts)}, expected {plugin}'s"
    assert_verdict(verdicts[plugin], "FAIL", says, technique, prop)
