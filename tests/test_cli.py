"""The command line as a user and a CI script meet it: exit codes, the JSON document, the reproduce line,
quiet pipes, and Ctrl-C.

Exit codes (harness/cli.py): 0 everything that should pass passed, 1 a property failed, 2 a usage error,
130 interrupted.  The JSON schema is docs/verdicts.md."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.shared import once

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).with_name("misbehaving_plugins.py")
STOP_WITHIN_S = 2.0


def harness(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llm_inference_harness", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, **kw)


@pytest.mark.parametrize("args, says", [
    (["check", "attentio"], "unknown technique 'attentio'"),
    (["check", "attention", "--plugin", "no_such_file.py:attention"], "no such file 'no_such_file.py'"),
    (["check", "attention", "--plugin", "attention_without_attr"], "--plugin must be MODULE:ATTR or FILE.py:ATTR"),
    (["check", "attention", "--plugin", "no_such_module_anywhere:f"], "no module named 'no_such_module_anywhere'"),
    (["check", "attention", "--impl", "fa9"], "no implementation fa9 of attention"),
    (["check", "attention", "--property", "no_such_law"], "unknown ['no_such_law']"),
    (["check", "attention", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["mutants", "attentio"], "unknown technique 'attentio'"),
    (["mutants", "--confirm", "results.jsonl"], "--confirm: expected with --machine-made DIR"),
    (["list", "attentio"], "unknown technique 'attentio'"),
])
def test_usage_errors_exit_2_with_one_line(args, says, capsys):
    """In this process (`main` is what `harness` calls): a process start each costs seconds;
    test_a_usage_error_exits_2_from_the_command_line shows the process's exit code is main's."""
    from llm_inference_harness.cli import main

    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, (code, err[-1000:])
    assert says in err and "Traceback" not in err, err[-1000:]


def test_a_usage_error_exits_2_from_the_command_line():
    proc = harness("check", "attentio")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-1000:])
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        "harness check: unknown technique 'attentio'"), proc.stderr[-1000:]


@pytest.fixture(scope="module")
def failing_check(tmp_path_factory) -> SimpleNamespace:
    """One `check` whose plugin fails (returns zeros), its JSON document on stdout (once a run): the tests below
    read its returncode, stdout and stderr."""
    def run(_):
        done = harness("check", "attention", "--plugin", f"{PLUGINS}:zeros", "--property", "matches_reference",
                       "--json", "-")
        return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    return SimpleNamespace(**once(tmp_path_factory, "failing_check", run))


def test_a_failure_exits_1(failing_check):
    """(A check that passes exits 0: tests/test_docs.py asserts it of every example plugin's check.)"""
    assert failing_check.returncode == 1, failing_check.stderr[-2000:]


def test_json_to_stdout_is_the_versioned_document(failing_check):
    """`--json -`: the document on stdout (the matrix goes to stderr), every field docs/verdicts.md lists."""
    proc = failing_check
    assert proc.returncode == 1, proc.stderr[-2000:]
    document = json.loads(proc.stdout)
    documented = set(re.findall(r"^\| `(\w+)` \|", (ROOT / "docs" / "verdicts.md").read_text(), re.M))
    present = set(document) | set(document["verdicts"][0]) | set(document["machine"]) | set(
        document["implementations"][0])
    assert documented and documented <= present, f"documented but absent: {sorted(documented - present)}"
    assert (document["schema"], document["schema_version"]) == ("llm-inference-harness/verdicts", 1)
    v = document["verdicts"][0]
    assert (v["impl"], v["property"], v["status"]) == ("zeros", "matches_reference", "FAIL")
    assert "implementation x property" in proc.stderr


def test_a_failure_reproduces_with_the_harness_command_alone(failing_check):
    """The reproduce line replays the failing example (a blob Hypothesis printed), and Hypothesis's advice to
    decorate a test function -- which a plugin author does not have -- is not shown."""
    shown = failing_check.stderr  # what the user reads (stdout holds the JSON document)
    assert "@reproduce_failure" not in shown and "decorator" not in shown, shown[-3000:]
    line = re.search(r"reproduce: harness (check .*)", shown).group(1)
    assert line == json.loads(failing_check.stdout)["verdicts"][0]["reproduce"].removeprefix("harness ")
    assert "--reproduce " in line, line
    again = harness(*line.replace("--profile ci", "--profile dev").split())  # dev draws randomly: only the blob
    assert again.returncode == 1 and "zeros vs float64 reference" in again.stdout, again.stdout[-3000:]
    assert "impl=<attention implementation" in again.stdout, again.stdout[-3000:]  # the replayed example is shown
    assert f"--reproduce {line.rsplit('--reproduce ', 1)[1]}" in again.stdout, again.stdout[-3000:]  # and kept


def test_list_into_a_closed_pipe_ends_quietly():
    proc = subprocess.run(f"{sys.executable} -m llm_inference_harness list | head -1", shell=True, capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert proc.stdout.count("\n") == 1 and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, (
        proc.stderr[-2000:])


def test_list_prints_the_capability_table(capsys):
    from llm_inference_harness.cli import main

    assert main(["list", "attention", "--caps"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"returns_lse\s+bool\s+\(default False\)", out), out[:2000]


def _children(pid: int) -> set[int]:
    """The checking processes of harness ``pid``: its children that lead their own session
    (llm_inference_harness.engine.isolation's setsid).  Not any child: importing the implementations runs `ldconfig
    -p`, and a Ctrl-C sent then lands mid-import."""
    ps = subprocess.run(["ps", "-eo", "pid=,ppid=,sid="], capture_output=True, text=True).stdout
    return {int(p) for p, parent, sid in (line.split() for line in ps.splitlines()) if int(parent) == pid
            and sid == p}


def _default_sigint() -> None:
    """Ctrl-C as a terminal delivers it: a test runner's worker may run with SIGINT ignored or blocked, which a
    child inherits."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _alive(pids: set[int]) -> set[int]:
    ps = subprocess.run(["ps", "-eo", "pid=,stat="], capture_output=True, text=True).stdout
    return {int(p) for p, stat in (line.split() for line in ps.splitlines()) if int(p) in pids and "Z" not in stat}


@pytest.mark.parametrize("command", ["check", "run"])
def test_ctrl_c_stops_within_two_seconds_and_leaves_nothing_half_written(command, tmp_path):
    """SIGINT while a call is running (the plugin sleeps inside it): the harness ends its checking processes,
    exits 130 within two seconds, and writes no verdict file, partial or whole."""
    out = tmp_path / "out"
    out.mkdir()  # a --json file's folder must exist (`run` creates HARNESS_OUT)
    args = (["check", "attention", "--plugin", f"{PLUGINS}:sleeps", "--json", str(out / "v.json")]
            if command == "check" else ["run", "--no-bench", "--no-report", "--jobs", "1"])
    log = tmp_path / "output.txt"  # a file, not a pipe: a stray process holding a pipe open is not the harness
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "llm_inference_harness", *args], cwd=ROOT, stdout=sink,
                                stderr=subprocess.STDOUT, env={**os.environ, "HARNESS_OUT": str(out)},
                                preexec_fn=_default_sigint)
    deadline, children = time.monotonic() + 240, set()
    while not children and time.monotonic() < deadline:
        time.sleep(0.2)  # wait for a checking process to exist
        children = _children(proc.pid)
    assert children, log.read_text()[-2000:]
    time.sleep(2.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        tree = subprocess.run(["ps", "-eo", "pid,ppid,sid,stat,args"], capture_output=True, text=True).stdout
        proc.kill()
        pytest.fail(f"still running 60 s after Ctrl-C; its output:\n{log.read_text()[-2000:]}\nprocesses:\n{tree}")
    output = log.read_text()
    took = time.monotonic() - sent
    assert proc.returncode == 130, output[-2000:]
    assert took <= STOP_WITHIN_S, f"stopped {took:.1f} s after Ctrl-C"
    assert "Traceback" not in output, output[-2000:]
    assert _alive(children) == set(), "a checking process outlived the harness"
    left = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert left == [], f"files left behind: {left}"


def test_every_help_page_renders(capsys):
    """argparse formats help lazily: a stray % in one subcommand's help broke `harness --help` for all."""
    from llm_inference_harness.cli import _parser, main

    commands = [[]] + [[name] for name in _parser()._subparsers._group_actions[0].choices]
    for command in commands:
        with pytest.raises(SystemExit) as exit_:
            main([*command, "--help"])
        assert exit_.value.code == 0, command
        assert "usage:" in capsys.readouterr().out, command


def test_a_mutant_that_cannot_run_here_is_counted_apart(monkeypatch, capsys):
    """A mutant of a library's adapter, without the library: every property skips, which is no survival (the
    library may be missing on a machine) -- and no kill: it is named as not run."""
    from llm_inference_harness import cli
    from llm_inference_harness.engine import runner

    def one_unrunnable(technique, **kw):
        target = runner.Target(technique, name="mutant_needs_lib")
        info = {"name": "mutant_needs_lib", "killed_by": ("matches_reference",), "bug": "a bug",
                "unavailable": "lib is not installed here"}
        return [runner.ImplResult(target, info, [runner.Verdict("mutant_needs_lib", "matches_reference", "skip",
                                                                message="lib is not installed here")])]

    monkeypatch.setattr(runner, "kill_mutants", one_unrunnable)
    assert cli.mutants(["attention"], profile="dev", jobs=1, json_path=None) == 0
    out = capsys.readouterr().out
    assert "attention          1 mutants: 1 not run here" in out, out
    assert "0 mutant(s) survived" in out
    assert "1 mutant(s) not run here, lib is not installed here: mutant_needs_lib" in out


DRAWS = '''
import sys

from hypothesis import given, settings, strategies as st

from llm_inference_harness.engine.profiles import load

load("ci")
if sys.argv[1] == "import":
    sys.path.insert(0, sys.argv[2])
    import distinctive_constants  # noqa: F401
seen = []


@settings(max_examples=300)  # the pool is drawn from now and then: enough draws to reach it
@given(st.integers())
def draw(x):
    seen.append(x)


draw()
print(seen)
'''


def test_the_cli_profiles_draw_the_same_examples_whatever_modules_are_imported(tmp_path):
    """Hypothesis also draws constants from the local modules imported so far; the CLI's profiles (`load`) turn that
    pool off, so an isolated judge (which imports no implementation) draws what an in-process one does."""
    (tmp_path / "distinctive_constants.py").write_text("ODD, ODDER = 987654321123, -0.000123456789\n")
    (tmp_path / "draws.py").write_text(DRAWS)

    def draws(*how):
        return subprocess.run([sys.executable, str(tmp_path / "draws.py"), *how], capture_output=True, text=True,
                              check=True).stdout

    assert draws("import", str(tmp_path)) == draws("none")
