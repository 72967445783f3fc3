"""The kvcache model protocol's machinery: without transformers every adapter is listed as unavailable and every
property skips saying so; the recorded upstream failure's reproduction shows what its record says (the documented
example model, docs/examples/kvcache_model.py, is checked through the CLI by tests/test_docs.py)."""

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from llm_inference_harness.engine.registry import KNOWN_FAILURES, load_all

ROOT = Path(__file__).resolve().parents[1]
load_all()  # the adapters record their known failures when they register

WITHOUT_TRANSFORMERS = """
import sys
sys.modules["transformers"] = None  # what importing a missing distribution finds
from llm_inference_harness.engine.registry import impls
from llm_inference_harness.engine.runner import properties_of, run_property
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

