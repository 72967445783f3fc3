"""A plugin that raises, hangs, crashes its process, returns NaN, zeros or the wrong shape, mutates its inputs, or
tries to escape its checking process (catching the alarm, resetting the timer, hoarding memory, flooding the
output, leaving a grandchild behind, changing global state, misbehaving while being imported) gets a verdict that
says which, with a line to reproduce it, and the run goes on and ends within its limits.

Runs `harness check` as a user would, on tests/misbehaving_plugins.py and tests/plugins/."""

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.shared import once

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).with_name("misbehaving_plugins.py")
IMPORTS = Path(__file__).with_name("plugins")
KILL_SLACK_S = 5.0  # a call past its limit is stopped within the limit plus this (alarm, grace, SIGTERM, SIGKILL)
EXPECTED = {  # attention plugin -> (status, what its message must say)
    "correct": ("pass", ""),
    "raises": ("FAIL", "raised RuntimeError: boom"),
    "hangs": ("FAIL", "hung: no result within the per-call limit of 1 s"),
    "crashes": ("FAIL", "crashed: the implementation's process exited with code 3"),
    "nan": ("FAIL", "returned a non-finite value"),
    "zeros": ("FAIL", "zeros vs float64 reference: max error"),
    "wrong_shape": ("FAIL", "wrong_shape output: returned shape (1, 1, 1, 1), expected (1, 1, 1, "),  # d is drawn
    "mutates": ("FAIL", "mutated its input k"),
    "hangs_catching_everything": ("FAIL", "hung: no result within the per-call limit"),
    "hangs_resetting_the_timer": ("FAIL", "hung: no result within the per-call limit"),
    "prints_a_lot": ("pass", ""),
    "spawns_a_grandchild": ("pass", ""),
    "changes_default_dtype": ("FAIL", "changed global state: torch default dtype torch.float32 -> torch.float64"),
    "seeds_torch": ("FAIL", "changed global state: torch global RNG"),
    "sets_threads": ("FAIL", "changed global state: torch intra-op threads"),
    "leaves_grad_off": ("FAIL", "changed global state: grad mode True -> False"),
}
OTHERS = {  # technique -> (plugin, the property run, what its message must say)
    "attention_backward": ("backward_two_gradients", "matches_reference",
                           "returned a tuple of 2, expected a tuple (dq, dk, dv)"),
    "paged_attention": ("paged_advances_seq_lens", "matches_contiguous_attention", "mutated its input seq_lens"),
    "kvcache": ("KVStepHangs", "prefill_then_steps_equal_forward", "hung: no result within the per-call limit of 1 s"),
    "block_manager": ("BlockManagerKeepsTokens", "machine_bookkeeping", "kept the caller's list"),
    "quantization": ("quantization_nan_scale", "all_zero_groups_give_zeros", "scale: returned a non-finite value"),
    "quantized_linear": ("linear_transposed", "matches_scheme_reference", "output: returned shape"),
    "speculative": ("speculative_extends_prompt", "matches_target_distribution",
                    "mutated its input prompt: [0] became"),
}


def check(technique: str, specs: list[str], prop: str, tmp_path: Path, *, env: dict | None = None,
          timeout: float = 600) -> dict[str, dict]:
    """`harness check --no-shrink` on these plugin specs; its verdicts by plugin spec (it must exit 1: one failed).
    Run through `main`, what `harness` calls, in this process (a process start costs seconds; the
    plugins are imported in the check's children either way), or from the command line where ``env`` sets a
    limit the harness reads at import.  Unshrunk: what is checked is the verdict and its reproduce line, not the
    minimal example (tests/test_cli.py checks a shrunk one), and shrinking each failure costs seconds."""
    from llm_inference_harness.cli import main

    out = tmp_path / "verdicts.json"
    argv = ["check", technique, *[arg for spec in specs for arg in ("--plugin", spec)], "--property", prop,
            "--profile", "ci", "--jobs", "2", "--json", str(out), "--no-shrink"]
    if env is None:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as printed:
            rc = main(argv)
        said = printed.getvalue()
    else:
        proc = subprocess.run([sys.executable, "-m", "llm_inference_harness", *argv], capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT, env={**os.environ, **env})
        rc, said = proc.returncode, proc.stderr
    assert rc == 1, f"exit {rc} (expected 1: plugins failed)\n{said[-2000:]}"
    document = json.loads(out.read_text())
    spec_of = {i["name"]: i["target"] for i in document["implementations"]}
    return {spec_of[v["impl"]]: v for v in document["verdicts"]}


def assert_verdict(v: dict, status: str, says: str, technique: str, prop: str, spec: str) -> None:
    assert (v["status"], says in v["message"]) == (status, True), f"{v['impl']}: {v['status']} '{v['message']}'"
    if status == "FAIL":
        line = f"check {technique} --plugin {spec} --property {prop}"
        assert line in v["reproduce"], f"{v['impl']}: reproduce line '{v['reproduce']}'"


@pytest.fixture(scope="module")
def attention_verdicts(tmp_path_factory) -> dict[str, dict]:
    """One `harness check attention` of every plugin EXPECTED lists (once a run): the tests below each read their
    plugins'."""
    specs = [f"{PLUGINS}:{name}" for name in EXPECTED]
    return once(tmp_path_factory, "attention_verdicts", lambda tmp: check("attention", specs, "matches_reference", tmp))


def test_each_misbehaving_plugin_gets_its_own_verdict(attention_verdicts):
    specs = [f"{PLUGINS}:{name}" for name in EXPECTED]
    assert sorted(attention_verdicts) == sorted(specs), (
        f"verdicts for {sorted(attention_verdicts)}, expected one per plugin")
    for name, (status, says) in EXPECTED.items():
        assert_verdict(attention_verdicts[f"{PLUGINS}:{name}"], status, says, "attention", "matches_reference",
                       f"{PLUGINS}:{name}")


def test_a_hang_that_escapes_the_alarm_is_stopped_within_its_limit(attention_verdicts):
    """Catching the alarm's exception, or switching the timer off, only delays the verdict by the grace period:
    the parent ends the child's process group (the per-call limit is 1 s)."""
    for name in ["hangs_catching_everything", "hangs_resetting_the_timer"]:
        v = attention_verdicts[f"{PLUGINS}:{name}"]
        assert "its process group was killed" in v["message"], v["message"]
        assert 1.0 <= v["seconds"] <= 1.0 + KILL_SLACK_S, f"{name}: stopped after {v['seconds']:.1f} s"


def test_output_is_captured_and_truncated(attention_verdicts):
    output = attention_verdicts[f"{PLUGINS}:prints_a_lot"]["output"]
    assert "earlier bytes not shown" in output and output.rstrip().endswith("debug: the last line a plugin printed")
    assert len(output) < 2500, f"{len(output)} characters of output in a verdict"


def test_a_memory_hog_is_stopped_at_the_memory_limit(tmp_path):
    verdicts = check("attention", [f"{PLUGINS}:hogs_memory"], "matches_reference", tmp_path,
                        env={"HARNESS_MEMORY_LIMIT_GB": "1"})
    assert "exceeded the memory limit of 1 GiB" in verdicts[f"{PLUGINS}:hogs_memory"]["message"]


def test_a_grandchild_does_not_keep_the_pipe_open(tmp_path):
    """`harness check ... | cat`: the reader sees the end of the output when the harness exits, though the plugin
    left a `sleep 300` behind (it dies with its checking process's group)."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "llm_inference_harness", "check", "attention", "--plugin",
                             f"{PLUGINS}:spawns_a_grandchild", "--property", "matches_reference"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    output, _ = proc.communicate(timeout=240)  # returns at EOF, i.e. when every writer has gone
    assert proc.returncode == 0, output.decode()[-2000:]
    assert time.monotonic() - start < 240


AT_IMPORT = {  # plugin module of tests/plugins/ -> what its verdict must say
    "import_exits.py": "crashed: the implementation's process exited with code 7 (while importing and registering it)",
    "import_segfaults.py": "crashed: the implementation's process was killed by signal SIGSEGV (while importing",
    "import_sleeps.py": "hung: not imported and registered within the import limit of 5 s (HARNESS_IMPORT_LIMIT_S) "
                        "(while importing",
}


@pytest.fixture(scope="module")
def import_verdicts(tmp_path_factory) -> dict[str, dict]:
    """One `harness check attention` of every plugin that misbehaves at import, and one correct plugin."""
    specs = [f"{IMPORTS / module}:attention" for module in AT_IMPORT] + [f"{PLUGINS}:correct"]
    return once(tmp_path_factory, "import_verdicts", lambda tmp: check(
        "attention", specs, "matches_reference", tmp,
        env={"HARNESS_IMPORT_LIMIT_S": "5"}))  # the correct plugin imports in well under 1 s


@pytest.mark.parametrize("module", sorted(AT_IMPORT))
def test_a_plugin_that_misbehaves_at_import_gets_a_verdict_and_a_json(module, import_verdicts):
    """The plugin is imported only in its checking process: the harness reports, writes its JSON, checks the
    others and exits 1."""
    spec = f"{IMPORTS / module}:attention"
    assert AT_IMPORT[module] in import_verdicts[spec]["message"], import_verdicts[spec]["message"]
    assert import_verdicts[f"{PLUGINS}:correct"]["status"] == "pass"


def test_an_entry_point_that_exits_at_import_does_not_take_list_or_pytest_down():
    """Another distribution's entry point loads only when asked for; when asked, it is probed in a child first."""
    env = {**os.environ, "PYTHONPATH": str(IMPORTS / "exits_on_import")}
    quiet = subprocess.run([sys.executable, "-m", "llm_inference_harness", "list", "quantization"], capture_output=True,
                           text=True, cwd=ROOT, env=env, timeout=300)
    assert quiet.returncode == 0 and "absmax" in quiet.stdout, quiet.stderr[-2000:]
    asked = subprocess.run([sys.executable, "-m", "llm_inference_harness", "list", "quantization", "--entry-points",
                            "all"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert asked.returncode == 0 and "absmax" in asked.stdout, asked.stderr[-2000:]
    assert "entry point exits = exits_on_import" in asked.stderr and "exited with code 7" in asked.stderr, asked.stderr
    suite = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_structure.py",
                            "-k", "capability"], capture_output=True, text=True, cwd=ROOT,
                           env={**env, "HARNESS_ENTRY_POINTS": "all"}, timeout=300)
    assert suite.returncode == 0, suite.stdout[-2000:]


@pytest.mark.parametrize("technique", sorted(OTHERS))
def test_every_technique_reports_a_misbehaving_plugin(technique, tmp_path):
    plugin, prop, says = OTHERS[technique]
    spec = f"{PLUGINS}:{plugin}"
    verdicts = check(technique, [spec], prop, tmp_path)
    assert sorted(verdicts) == [spec], f"verdicts for {sorted(verdicts)}, expected {plugin}'s"
    assert_verdict(verdicts[spec], "FAIL", says, technique, prop, spec)


def test_a_sampler_that_edits_its_table_model_is_caught_both_ways(tmp_path):
    """A table model crosses by value (a copy over there, kept while unchanged: the sampler's calls of it cost no
    round trip to the judge); a copy edited in place is a changed input, as a module's weights are, and so is the
    model itself in the judge's own process."""
    from llm_inference_harness.engine.guard import ContractViolation, guarded_call
    from llm_inference_harness.sampling.lm import TableLM, TorchRng
    from tests.misbehaving_plugins import speculative_edits_its_draft

    spec, prop = f"{PLUGINS}:speculative_edits_its_draft", "round_records_add_up"
    assert_verdict(check("speculative", [spec], prop, tmp_path)[spec], "FAIL", "mutated its input draft.table",
                   "speculative", prop, spec)
    target, draft = TableLM(torch.full((3,), 1 / 3, dtype=torch.float64)), TableLM(torch.tensor([0.5, 0.3, 0.2]))
    with pytest.raises(ContractViolation, match=r"mutated its input draft\.table"):
        guarded_call(speculative_edits_its_draft, target, draft, [0], gamma=1, max_new_tokens=2, rng=TorchRng(0),
                     arg_names=("target", "draft", "prompt"))


def test_an_entry_point_is_listed_and_judged_but_never_imported_by_the_harness(tmp_path):
    """Another distribution's implementation is described by a process of its own and judged in another: the
    harness's own processes (the command, the judge) learn its name and declarations but never run its code."""
    imported_by = tmp_path / "imported_by"
    imported_by.touch(mode=0o666)  # the implementation's process may run as a user of its own
    imported_by.chmod(0o666)
    env = {**os.environ, "PYTHONPATH": str(IMPORTS / "registers_an_attention"), "IMPORTED_BY": str(imported_by),
           "HARNESS_ENTRY_POINTS": "theirs"}
    listed = subprocess.run([sys.executable, "-m", "llm_inference_harness", "list", "attention"], capture_output=True,
                            text=True, cwd=ROOT, env=env, timeout=300)
    assert listed.returncode == 0 and "theirs_sdpa" in listed.stdout, listed.stderr[-2000:]
    command = subprocess.Popen([sys.executable, "-m", "llm_inference_harness", "check", "attention",
                                "--impl", "theirs_sdpa", "--property", "matches_reference", "--jobs", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    output, _ = command.communicate(timeout=600)
    assert command.returncode == 0 and "1 passed" in output, output[-2000:]
    importers = {int(line) for line in imported_by.read_text().split()}
    assert command.pid not in importers and listed.returncode == 0 and len(importers) >= 2
