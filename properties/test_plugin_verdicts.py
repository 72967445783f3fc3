"""A plugin that raises, hangs, crashes its process, returns NaN, zeros or the wrong shape, or mutates its
inputs gets a verdict that says which, with a line to reproduce it, and the run goes on to the next.

Runs `python -m harness check` as a user would, on properties/misbehaving_plugins.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

PLUGINS = Path(__file__).with_name("misbehaving_plugins.py")
EXPECTED = {  # plugin -> (status, what its message must say)
    "correct": ("pass", ""),
    "raises": ("FAIL", "raised RuntimeError: boom"),
    "hangs": ("FAIL", "hung: no result within the per-call limit of 1 s"),
    "crashes": ("FAIL", "crashed: the checking process died with exit code 3"),
    "nan": ("FAIL", "returned a non-finite value"),
    "zeros": ("FAIL", "zeros vs float64 reference: max error"),
    "wrong_shape": ("FAIL", "returned shape (1, 1, 1, 1), expected (1, 1, 1, 3)"),
    "mutates": ("FAIL", "mutated its input k"),
}


def test_each_misbehaving_plugin_gets_its_own_verdict(tmp_path):
    out = tmp_path / "verdicts.json"
    plugins = [arg for name in EXPECTED for arg in ("--plugin", f"{PLUGINS}:{name}")]
    proc = subprocess.run([sys.executable, "-m", "harness", "check", "attention", *plugins, "--property",
                           "matches_reference", "--profile", "ci", "--jobs", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=PLUGINS.parent.parent,
                          env={**os.environ, "HARNESS_PER_IMPL_LIMIT_S": "300"})
    assert proc.returncode == 1, f"exit {proc.returncode} (expected 1: plugins failed)\n{proc.stderr[-2000:]}"
    verdicts = {v["impl"]: v for v in json.loads(out.read_text())}
    assert sorted(verdicts) == sorted(EXPECTED), f"verdicts for {sorted(verdicts)}, expected one per plugin"
    for name, (status, says) in EXPECTED.items():
        v = verdicts[name]
        assert (v["status"], says in v["message"]) == (status, True), f"{name}: {v['status']} '{v['message']}'"
        if status == "FAIL":
            assert f"--plugin {PLUGINS}:{name} --property matches_reference" in v["reproduce"], (
                f"{name}: reproduce line '{v['reproduce']}'")
