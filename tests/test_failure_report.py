"""What a failure tells its reader: the contract rule the failing property judges (harness/contracts: `Rule`), and,
where Hypothesis found several distinct failures, one reproduce line per failure, each replaying its own example.
(The plugin's rule in a downstream pytest session: tests/test_wheel.py.)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared import once

ROOT = Path(__file__).resolve().parents[1]
TWO_WAYS = '''
import torch
from llm_inference_harness.impls.attention.naive import naive_attention


def two_ways(q, k, v, *, causal=False, scale=None):  # raises when causal, returns zeros otherwise
    if causal:
        raise RuntimeError("causal is not supported")
    return torch.zeros_like(naive_attention(q, k, v, causal=causal, scale=scale))
'''


def harness(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llm_inference_harness", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def test_every_property_judges_a_rule_of_its_contract():
    """Declared in each contract module: every property is named by a rule, every name a rule gives is a property."""
    from llm_inference_harness.contracts import load_techniques
    from llm_inference_harness.engine.runner import properties_of

    for technique in load_techniques().values():
        names = {p.name for p in properties_of(technique.name)}
        judged = {name for rule in technique.rules for name in rule.properties}
        assert names <= judged, f"{technique.name}: no rule names {sorted(names - judged)}"
        assert judged <= names, f"{technique.name}: rules name unknown properties {sorted(judged - names)}"
        assert len({r.name for r in technique.rules}) == len(technique.rules), f"{technique.name}: a rule twice"


@pytest.fixture(scope="module")
def two_ways(tmp_path_factory) -> dict:
    """One check of a plugin that fails matches_reference two ways (a raise when causal, zeros otherwise)."""
    def run(folder: Path):
        (folder / "two.py").write_text(TWO_WAYS)
        done = harness("check", "attention", "--plugin", "two.py:two_ways", "--property", "matches_reference",
                       "--json", "-", cwd=folder)
        return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "folder": str(folder)}
    return once(tmp_path_factory, "two_ways", run)


def test_a_failure_names_the_rule_its_property_judges(two_ways):
    assert two_ways["returncode"] == 1, two_ways["stderr"][-3000:]
    verdict = json.loads(two_ways["stdout"])["verdicts"][0]
    rule = "the attention contract's output rule: the output is softmax(q k^T * scale) v"
    assert rule in verdict["message"], verdict["message"]
    assert "FAIL two_ways / matches_reference: 2 distinct failures" in two_ways["stderr"]
    assert rule in two_ways["stderr"], two_ways["stderr"][-3000:]


def test_each_distinct_failure_gets_its_own_reproduce_line(two_ways):
    """Both in the matrix and in the JSON (one command per line), and each replays its own failure."""
    shown = two_ways["stderr"]
    lines = json.loads(two_ways["stdout"])["verdicts"][0]["reproduce"].splitlines()
    assert len(lines) == 2 and len(set(lines)) == 2, lines
    for i, line in enumerate(lines, 1):
        assert f"  reproduce failure {i} of 2: {line}\n" in shown, shown[-3000:]
    replayed = []
    for line in lines:
        again = harness(*line.removeprefix("harness ").split(), "--no-shrink", cwd=Path(two_ways["folder"]))
        assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-2000:]
        replayed.append(next(ln for ln in again.stdout.splitlines() if ln.startswith("FAIL two_ways /")))
    assert "raised RuntimeError: causal is not supported" in replayed[0] + replayed[1], replayed
    assert "two_ways vs float64 reference: max error" in replayed[0] + replayed[1], replayed
    assert "distinct failures" not in replayed[0] + replayed[1], replayed


def test_under_the_pytest_plugin_each_distinct_failure_gets_its_reproduce_line():
    """What the plugin adds to a failure of several distinct failures (Hypothesis's ExceptionGroup, each failure with
    its @reproduce_failure advice): a harness command per failure, in order, and no advice to edit our test."""
    from llm_inference_harness.engine.pytest_plugin import _advise_the_harness_command

    failures = []
    for blob in ("AAAA", "BBBB"):
        exc = AssertionError(f"failure {blob}")
        exc.add_note(f"You can reproduce this example by temporarily adding @reproduce_failure('6.1', b'{blob}') as a "
                     "decorator on your test case")
        failures.append(exc)
    group = ExceptionGroup("Hypothesis found 2 distinct failures.", failures)
    _advise_the_harness_command(group, "attention", "my_pkg.kernels:attention", "matches_reference", "ci")
    command = ("harness check attention --plugin my_pkg.kernels:attention --property matches_reference --profile ci "
               "--reproduce 6.1:")
    assert group.__notes__ == [f"Reproduce failure 1 of 2: {command}AAAA", f"Reproduce failure 2 of 2: {command}BBBB"]
    assert all("@reproduce_failure" not in note for exc in failures for note in exc.__notes__)
