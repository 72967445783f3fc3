"""Progress of long work: on a non-terminal, plain lines (start, at most one per interval, end) with counts and
an ETA, never carriage-return redraws."""

import io

from llm_inference_harness.engine.progress import LineProgress, progress


def test_lines_not_redraws_off_a_terminal():
    out = io.StringIO()
    for _ in progress(range(5), desc="enumerating", unit="runs", file=out):
        pass
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0] == "enumerating: started (5 runs)" and lines[-1].startswith("enumerating: done, 5/5 runs in")


def test_a_line_per_interval_with_an_eta():
    out = io.StringIO()
    bar = LineProgress(total=10, desc="training", unit="steps", every_s=0.0, file=out)
    bar.update(4)
    bar.close()
    assert "training: 4/10 steps in" in out.getvalue() and "ETA" in out.getvalue()


def test_disabled_is_silent():
    out = io.StringIO()
    for _ in progress(range(3), desc="x", enabled=False, file=out):
        pass
    assert out.getvalue() == ""
