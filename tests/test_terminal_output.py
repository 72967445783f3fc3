"""What `harness run` and `harness check` print for a person: a progress display (a line at most every 30 s in a
log), each failure in full, one line per skip reason with its counts, a summary; the detail -- a line per finished
(implementation, property), each skip's property, the matrix in `run`, a line per mutant -- behind ``-v`` and in the
JSON."""

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from llm_inference_harness.engine import runner
from llm_inference_harness.engine.terminal import Printer, print_matrix

ROOT = Path(__file__).resolve().parents[1]
PROPS = ["matches_reference", "triton_large_logits", "rows_are_batch_invariant"]


def results(n: int = 30) -> list[runner.ImplResult]:
    """n implementations: every one skips the Triton property (its own name in the message, as the predicates say)
    and passes the others; one fails matches_reference."""
    found = []
    for i in range(n):
        name = f"impl{i}"
        verdicts = [runner.Verdict(name, "matches_reference", "FAIL" if i == 0 else "pass",
                                   message="AssertionError: wrong" if i == 0 else ""),
                    runner.Verdict(name, "triton_large_logits", "skip",
                                   message=f"{name} does not declare 'triton' (a Triton kernel)"),
                    runner.Verdict(name, "rows_are_batch_invariant", "skip",
                                   message=f"{name} does not declare 'batch_invariant' (each row's bits may depend "
                                           f"on {'its batch' if i % 2 else 'the queries computed with it'})")]
        found.append(runner.ImplResult(runner.Target("attention", name=name), {"name": name}, verdicts))
    return found


def printed(**kw) -> list[str]:
    out = io.StringIO()
    props = [runner.Property(p, lambda impl: None, "m") for p in PROPS]
    print_matrix("attention", results(), props, out, **kw)
    return out.getvalue().splitlines()


def test_skips_are_one_line_per_reason_with_counts():
    shown = printed()
    skips = [line for line in shown if line.startswith("skip")]
    assert skips == ["skip  30: does not declare 'batch_invariant' -- 30 implementations x 1 property",  # two remarks
                     "skip  30: does not declare 'triton' (a Triton kernel) -- 30 implementations x 1 property"], skips
    assert "FAIL impl0 / matches_reference: AssertionError: wrong" in shown, shown
    assert shown[-1] == "29 passed, 1 failed, 60 skipped", shown[-3:]


def test_without_the_matrix_a_technique_is_a_summary_line():
    shown = printed(matrix=False)
    assert not any("implementation x property" in line or line.startswith("  impl") for line in shown), shown
    assert shown[-1] == "attention (30 implementations x 3 properties): 29 passed, 1 failed, 60 skipped", shown[-3:]
    assert len(shown) <= 8, shown


def test_detail_restores_every_skip_and_the_matrix():
    shown = printed(detail=True, matrix=True)
    assert sum(line.startswith("skip triton_large_logits: impl") for line in shown) == 30, shown
    assert sum(line.startswith("  impl") for line in shown) == 30, shown  # a matrix row each


def test_a_log_gets_a_progress_line_at_most_every_so_often_and_each_failure():
    def lines(verbose: bool) -> list[str]:
        out = io.StringIO()  # not a terminal: no bar
        with Printer("attention", 90, out, verbose=verbose) as printer:
            for r in results():
                for v in r.verdicts:
                    printer.finished(r.target, v)
        return out.getvalue().splitlines()

    quiet = lines(verbose=False)
    assert len(quiet) == 1 and "impl0 / matches_reference: FAIL" in quiet[0], quiet  # within 30 s: no count line
    assert len(lines(verbose=True)) == 90


def test_run_prints_a_summary_of_a_technique(tmp_path):
    """The real command on a small technique (6-7 implementations, 10 properties, 13 mutants: about 25 s of CPU)."""
    done = subprocess.run([sys.executable, "-m", "llm_inference_harness", "run", "attention_backward", "--no-bench",
                           "--no-report", "--jobs", "2"], capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env={**os.environ, "HARNESS_OUT": str(tmp_path)})
    shown = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 0, shown[-60:]
    assert len(shown) <= 25, "\n".join(shown)
    summary = r"attention_backward \(\d+ implementations x 10 properties\): \d+ passed, 0 failed, \d+ skipped"
    assert any(re.fullmatch(summary, line) for line in shown), shown
    assert any(re.fullmatch(r"skip +\d+: declares devices \('cuda',\), none available here -- 1 implementation x "
                            r"10 properties", line) for line in shown), shown
    assert any(re.fullmatch(r"attention_backward +\d+ mutants: \d+ killed", line) for line in shown), shown
    assert not any(" / matches_reference: pass" in line for line in shown), shown
    assert (tmp_path / "verdicts" / "attention_backward.json").is_file()  # the detail, in the JSON


def test_known_upstream_failures_are_a_line_per_record_and_in_full_with_detail():
    record = "known upstream failure of lib 1.0 (lib 1.0 installed): it rounds twice"
    verdicts = [runner.Verdict("lib_impl", prop, "upstream", message=f"{record}; this run: AssertionError: off",
                               counterexample="case\n\nminimal reproduction:\nimport lib\nlib.f()")
                for prop in ("matches_reference", "rows_are_batch_invariant")]
    found = [runner.ImplResult(runner.Target("attention", name="lib_impl"), {"name": "lib_impl"}, verdicts)]
    props = [runner.Property(p, lambda impl: None, "m") for p in PROPS]

    def shown(**kw) -> str:
        out = io.StringIO()
        print_matrix("attention", found, props, out, **kw)
        return out.getvalue()

    brief = shown(matrix=False)
    assert f"upstr lib_impl: 2 properties (matches_reference, rows_are_batch_invariant): {record}\n" in brief, brief
    assert "minimal reproduction" not in brief, brief
    assert shown(matrix=False, detail=True).count("minimal reproduction:\n  import lib") == 2
