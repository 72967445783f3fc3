"""The kvcache model protocol's machinery: without transformers every adapter is listed as unavailable and every
property skips saying so; the documented example model passes its properties; the recorded upstream failure's
reproduction shows what its record says."""

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from harness.plugins import load_plugin
from harness.registry import KNOWN_FAILURES, load_all
from harness.runner import properties_of, run_property

ROOT = Path(__file__).resolve().parents[1]
load_all()  # the adapters record their known failures when they register
MODEL_PROPERTIES = [p for p in properties_of("kvcache") if p.module == "properties.test_kvcache_models"]

WITHOUT_TRANSFORMERS = """
import sys
sys.modules["transformers"] = None  # what importing a missing distribution finds
from harness.registry import impls
from harness.runner import properties_of, run_property
adapters = [i for i in impls("kvcache", mutants=None) if i.caps.speaks == "model"]
assert len(adapters) >= 17, [i.name for i in adapters]
for impl in adapters:
    for prop in properties_of("kvcache"):
        verdict = run_property(prop, impl, profile="ci")
        assert verdict.status == "skip", (impl.name, prop.name, verdict.status, verdict.message)
        assert "transformers is not installed here" in verdict.message, verdict.message
print("skipped", len(adapters))
"""


def test_without_transformers_every_adapter_skips_naming_it():
    done = subprocess.run([sys.executable, "-c", WITHOUT_TRANSFORMERS], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("skipped"), done.stdout


def test_the_documented_example_model_passes():
    impl = load_plugin(str(ROOT / "docs/examples/kvcache_model.py") + ":build", "kvcache")
    verdicts = {p.name: run_property(p, impl, profile="ci") for p in MODEL_PROPERTIES}
    assert {v.status for v in verdicts.values()} <= {"pass", "skip"}, {
        n: v.message for n, v in verdicts.items() if v.status not in ("pass", "skip")}
    assert verdicts["model_padded_and_unused_slots_never_leak"].status == "skip"  # it declares no poison hook
    assert sum(v.status == "pass" for v in verdicts.values()) == len(MODEL_PROPERTIES) - 1


@pytest.mark.parametrize("record", sorted({(k.library, k.reproduce) for k in KNOWN_FAILURES.values()
                                           if k.impl.startswith("hf_")}))
def test_recorded_reproduction_shows_the_failure(record):
    """The fp8 cache record's reproduction, run with transformers alone, prints the saturated key it describes."""
    pytest.importorskip("transformers")
    library, code = record
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<reproduction>", "exec"), {})
    assert out.getvalue().strip().startswith("tensor([ 1., -1.])"), out.getvalue()

