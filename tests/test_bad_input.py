"""Bad input anywhere gets a clear error, and no result is ever lost.

A bad argument or a bad file read back ends every subcommand with one line naming the argument or the file and what
was expected, exit code 2, before any work starts; a plugin that cannot be loaded gets one verdict naming its file,
line and exception; a result file is written whole or not at all, however the run ends.

The command line is driven through `main` in this process (what `harness` calls) with the work itself --
a check, the mutants, a comparison, the report -- replaced by a stand-in that says it was reached: validation comes
first, so a bad argument costs milliseconds and never reaches it.  Exit codes: README.md, docs/verdicts.md."""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_inference_harness import cli
from llm_inference_harness.bench import asvrun, compare, quickbench
from llm_inference_harness.engine import inputs, outputs, profiles, provenance, runner

ROOT = Path(__file__).resolve().parents[1]
EXIT_CODES = {0, 1, 2, 130}  # README.md: passed, failed, usage error (a bad argument, path or file), interrupted
BLOB = "AXicY2BkYGAAAAAJAAM="  # a well-formed --reproduce blob (its example is never replayed here)


class WorkReached(Exception):
    """A stand-in for the work a command does once its arguments are valid."""


def _reached(*args, **kwargs):
    raise WorkReached


STAND_INS = [(runner, "check"), (runner, "kill_mutants"), (compare, "compare_commits"), (compare, "compare_impls"),
             (quickbench, "run_quick")]


@pytest.fixture(scope="module")
def no_work(tmp_path_factory):
    """A scratch folder holding a file (`afile`) and a folder (`adir`), and HARNESS_OUT under it (holding the
    suite's description, `llm_inference_harness.bench.asvrun.suite`)."""
    tmp = tmp_path_factory.mktemp("bad-input")
    (tmp / "afile").write_text("a file, not a folder\n")
    (tmp / "adir").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_OUT", str(tmp / "out"))
        asvrun.suite()  # asv's description of the suite, a cache the report reads: there before any command runs
        yield tmp


def invoke(argv: list[str], *, work: bool = False) -> tuple[object, str, str]:
    """(exit code, or "work" where the work was reached; stdout; stderr) of `harness ARGV`; the work
    itself replaced by `WorkReached` unless ``work``."""
    import llm_inference_harness.bench.report

    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err, \
            pytest.MonkeyPatch.context() as mp:
        for module, name in [] if work else [*STAND_INS, (llm_inference_harness.bench.report, "write_report")]:
            mp.setattr(module, name, _reached)
        if not work:  # loading a profile would change this test session's (argparse has checked the name)
            mp.setattr(profiles, "load", lambda name: None)
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's own: --help, a mistyped flag
            code = exc.code
        except WorkReached:
            code = "work"
    return code, out.getvalue(), err.getvalue()


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


# (argv, what the one line must say); {tmp} is the scratch folder, {hv} this Hypothesis's version
BAD_ARGUMENTS = [
    (["check", "attentio"], "unknown technique 'attentio'; known: attention, attention_backward"),
    (["check", ""], "unknown technique ''"),
    (["check", "attention", "--impl", "fa9"], "no implementation fa9 of attention"),
    (["check", "attention", "--impl", ""], "--impl: an empty name"),
    (["check", "attention", "--property", "no_such_law"], "--property: unknown ['no_such_law']; known:"),
    (["check", "attention", "--property", ""], "--property: an empty name"),
    (["check", "attention", "--profile", "fast"], "argument --profile: invalid choice: 'fast'"),
    (["check", "attention", "--jobs", "0"], "--jobs 0: expected a whole number >= 1"),
    (["check", "attention", "--jobs", "-3"], "--jobs -3: expected a whole number >= 1"),
    (["check", "attention", "--jobs", "two"], "argument --jobs: invalid int value: 'two'"),
    (["check", "attention", "--json", ""], "--json: empty path"),
    (["check", "attention", "--json", "{tmp}/missing/v.json"], "the folder {tmp}/missing does not exist"),
    (["check", "attention", "--json", "{tmp}/afile/v.json"], "{tmp}/afile is a file, not a folder"),
    (["check", "attention", "--json", "{tmp}/adir"], "--json {tmp}/adir: is a folder"),
    (["check", "attention", "--json", "/sys/v.json"], "cannot create files in /sys"),  # read-only, even for root
    (["check", "attention", "--reproduce", "garbage", "--property", "matches_reference"],
     "--reproduce 'garbage': expected VERSION:BLOB"),
    (["check", "attention", "--reproduce", f"1.2.3:{BLOB}", "--property", "matches_reference"],
     "recorded by Hypothesis 1.2.3"),
    (["check", "attention", "--reproduce", "{hv}:" + BLOB], "--reproduce replays one property's example"),
    (["check", "attention", "--plugin", ""], "--plugin: an empty name"),
    (["check", "attention", "--plugin", "attention_without_attr"], "--plugin must be MODULE:ATTR or FILE.py:ATTR"),
    (["check", "attention", "--plugin", "no_such_file.py:attention"], "no such file 'no_such_file.py'"),
    (["check", "attention", "--plugin", "no_such_module_anywhere:f"], "no module named 'no_such_module_anywhere'"),
    (["check", "attention", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["list", "attentio"], "unknown technique 'attentio'"),
    (["list", "--entry-points", "nope"], "--entry-points: no entry point 'nope' of another distribution"),
    (["mutants", "attentio"], "unknown technique 'attentio'"),
    (["mutants", "attention", "--jobs", "0"], "--jobs 0: expected a whole number >= 1"),
    (["mutants", "--json", "{tmp}/missing/m.json"], "the folder {tmp}/missing does not exist"),
    (["run", "--jobs", "-1"], "--jobs -1: expected a whole number >= 1"),
    (["run", "--profile", "quick"], "argument --profile: invalid choice: 'quick'"),
    (["compare", "--impls", "nope", "sdpa", "--bench", "AttentionForward"], "--impls: no implementation 'nope'"),
    (["compare", "--impls", "sdpa"], "argument --impls: expected 2 arguments"),
    (["compare", "nocommit", "HEAD"], "no commit 'nocommit'"),
    (["compare", "HEAD", "nocommit"], "no commit 'nocommit'"),
    (["compare", "HEAD", "HEAD", "--bench", "Attention("], "--bench 'Attention(': not a regular expression"),
    (["compare", "HEAD", "HEAD", "--bench", ""], "--bench: an empty pattern"),
    (["compare", "HEAD", "HEAD", "--rounds", "-5"], "--rounds -5: expected a whole number >= 1"),
    (["compare", "HEAD", "HEAD", "--pairs", "0"], "--pairs 0: expected a whole number >= 1"),
    (["compare", "HEAD", "HEAD", "--threads", "-1"], "--threads -1: expected a whole number >= 0"),
    (["compare", "HEAD", "HEAD", "--clock", "sundial"], "argument --clock: invalid choice: 'sundial'"),
    (["compare", "HEAD", "HEAD", "--json", "{tmp}/afile/c.json"], "{tmp}/afile is a file, not a folder"),
    (["gate", "nocommit"], "no commit 'nocommit'"),
    (["gate", "HEAD", "nocommit"], "no commit 'nocommit'"),
    (["gate", "HEAD", "HEAD", "--bench", "("], "--bench '(': not a regular expression"),
    (["report", "--only", "no such section"], "--only 'no such section': no section's title contains it"),
    (["report", "--only", ""], "--only '': no section's title contains it"),
    (["report", "--out", "{tmp}/afile"], "--out {tmp}/afile: {tmp}/afile is a file, not a folder"),
    (["report", "--out", "{tmp}/missing/report"], "the folder {tmp}/missing does not exist"),
    (["report", "--out", "/sys/report"], "cannot create files in /sys"),
]
BAD_RESULTS_FOLDERS = [  # HARNESS_OUT -> what the one line must say, for `run` and `report`
    ("{tmp}/afile/out", "HARNESS_OUT {tmp}/afile/out: {tmp}/afile is a file, not a folder"),
    ("{tmp}/missing/out", "HARNESS_OUT {tmp}/missing/out: the folder {tmp}/missing does not exist"),
]


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{tmp}", str(tmp)).replace("{hv}", hypothesis.__version__)


def assert_usage_error(code, out: str, err: str, says: str, argv: list[str]) -> None:
    assert code == 2, f"{argv}: exit {code}\n{err[-2000:]}"
    assert says in err, f"{argv}: {err!r} does not say {says!r}"
    assert err.count("\n") == 1 and err.startswith("harness"), f"{argv}: not one line: {err!r}"
    assert "Traceback" not in err + out, f"{argv}: {err}"


@pytest.mark.parametrize("argv, says", BAD_ARGUMENTS, ids=[" ".join(a) or "''" for a, _ in BAD_ARGUMENTS])
def test_a_bad_argument_is_one_line_and_exit_2_before_any_work(argv, says, no_work):
    before = files_under(no_work)
    code, out, err = invoke([_fill(a, no_work) for a in argv])
    assert_usage_error(code, out, err, _fill(says, no_work), argv)
    assert files_under(no_work) == before, "a failed command left a file behind"


@pytest.mark.parametrize("command", [["run"], ["report"]])
@pytest.mark.parametrize("results, says", BAD_RESULTS_FOLDERS)
def test_an_unwritable_results_folder_is_one_line_and_exit_2(command, results, says, no_work, monkeypatch):
    monkeypatch.setenv("HARNESS_OUT", _fill(results, no_work))
    code, out, err = invoke(command)
    assert_usage_error(code, out, err, _fill(says, no_work), command)


# --- files read back ------------------------------------------------------------------------------------------
def _verdicts(**changes) -> str:
    document = {"schema": "llm-inference-harness/verdicts", "schema_version": 1, "kind": "check",
                "technique": "attention", "commit": "0123456789ab", "machine": {"name": "vm"},
                "verdicts": [{"impl": "naive", "property": "matches_reference", "status": "pass"}]}
    return json.dumps({**document, **changes})


MACHINE = provenance.machine_name()
ASV_RESULT = {"version": 2, "commit_hash": "ab" * 20, "result_columns": ["result", "params"], "results": {}}
BAD_FILES = [  # (file under HARNESS_OUT, its content, what the one line must say)
    ("verdicts/attention.json", _verdicts()[:60], "not valid JSON at line 1 column 46: Unterminated string starting "
                                                   "at (the file ends inside the document: truncated?)"),
    ("verdicts/attention.json", "", "verdicts/attention.json: empty; expected a verdicts document"),
    ("verdicts/attention.json", '["a", "list"]', "the document is a JSON list, not an object"),
    ("verdicts/attention.json", _verdicts(schema="asv-results"), "schema 'asv-results', expected "
                                                                 "'llm-inference-harness/verdicts'"),
    ("verdicts/attention.json", _verdicts(schema_version=2), "schema_version 2: this harness reads verdicts "
                                                             "documents version 1 (a newer harness"),
    ("verdicts/attention.json", _verdicts(verdicts=[{"impl": "naive", "property": "p"}]), "verdicts[0].status is "
                                                                                         "missing"),
    ("verdicts/attention.json", _verdicts(verdicts=[{"impl": "naive", "property": "p", "status": "ok"}]),
     "verdicts[0].status 'ok', expected one of pass, FAIL"),
    ("verdicts/mutants.json", _verdicts(kind="mutants"), "techniques is missing"),
    (f"asv/{MACHINE}/abcdef12-env.json", json.dumps(ASV_RESULT)[:50], "not valid JSON"),
    (f"asv/{MACHINE}/abcdef12-env.json", json.dumps({**ASV_RESULT, "version": 1}),
     "version 1: this harness reads asv result files version 2"),
    (f"asv/{MACHINE}/abcdef12-env.json", json.dumps({**ASV_RESULT, "results": []}),
     "results is list [], expected an object"),
    (f"asv/{MACHINE}/machine.json", json.dumps({"version": 1, "machine": "elsewhere"}),
     "machine 'elsewhere', but the file is in the folder of"),
    ("asv/benchmarks.json", json.dumps({"version": 2, "bench_x.T.time_y": {"code": "..."}}),
     "'bench_x.T.time_y'.version is missing"),
    ("report/skipped.json", '{"not": "a list"}', "expected the report's list of what could not run"),
]


@pytest.mark.parametrize("relative, content, says", BAD_FILES, ids=[f"{r}:{s[:30]}" for r, _, s in BAD_FILES])
def test_a_bad_file_read_back_is_named_in_one_line_and_exit_2(relative, content, says, no_work, tmp_path,
                                                               monkeypatch):
    """`report` reads what `run` saved (verdicts), asv's results and its own previous run: a truncated, empty,
    other-schema or other-version file is named before any section runs, never a traceback or an empty report."""
    from llm_inference_harness.bench.report import asvdata

    monkeypatch.setenv("HARNESS_OUT", str(tmp_path))
    path = tmp_path / relative
    path.parent.mkdir(parents=True)
    if path.parent.parent.name == "asv" and path.name != "machine.json":
        (path.parent / "machine.json").write_text(json.dumps({"version": 1, "machine": path.parent.name}))
    path.write_text(content)
    if path.name == "benchmarks.json":  # the suite as discovered at this very code: read back, not rediscovered
        from llm_inference_harness.bench.asvrun import _code_stamp

        path.with_suffix(".commit").write_text(_code_stamp())
    asvdata.current_versions.cache_clear()
    try:
        code, out, err = invoke(["report", "--quick"])
    finally:
        asvdata.current_versions.cache_clear()
    assert_usage_error(code, out, err, f"{path}: ", ["report"])
    assert says in err, f"{err!r} does not say {says!r}"


def test_the_history_and_the_dashboard_name_a_bad_file_before_handing_it_to_asv(tmp_path):
    from llm_inference_harness.bench import dashboard, history

    folder = tmp_path / "vm"
    folder.mkdir()
    (folder / "machine.json").write_text('{"version": 1, "machine": "vm"')
    with pytest.raises(inputs.BadFile, match=r"vm/machine.json: not valid JSON .*truncated"):
        history.normalize(tmp_path)
    with pytest.raises(inputs.BadFile, match=r"vm/machine.json: not valid JSON"):
        dashboard.read_inputs([tmp_path])


@pytest.mark.parametrize("shard, says", [("4/3", "--shard '4/3': expected K/N with 0 <= K < N"),
                                         ("x", "--shard 'x': expected K/N"), ("0/0", "--shard '0/0'")])
def test_a_backfill_checks_its_shard_before_measuring(shard, says, tmp_path, monkeypatch, capsys):
    from llm_inference_harness.bench import history

    monkeypatch.setattr(sys, "argv", ["llm_inference_harness.bench.history", "backfill", "--shard", shard,
                                      "--results", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        history.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and says in err and "Traceback" not in err, err
    assert files_under(tmp_path) == set()


# --- any argument list ----------------------------------------------------------------------------------------
def _options(command: str) -> list[str]:
    sub = cli._parser()._subparsers._group_actions[0].choices[command]
    return [o for action in sub._actions for o in action.option_strings]


COMMANDS = ["list", "check", "mutants", "run", "compare", "gate", "report"]
VALUES = ["attention", "kvcache", "naive", "sdpa", "matches_reference", "ci", "dev", "HEAD", "main", "2", "1", "0",
          "-1", "", " ", "nope", "--", "-", "(", "a/b", "4/3", "AttentionForward", "Conformance", "{tmp}/v.json",
          "{tmp}/missing/v.json", "{tmp}/afile", "{tmp}/adir", "/sys/v.json", "no_such.py:f",
          "docs/examples/attention.py:attention", "{hv}:" + BLOB, "garbage", "all"]


@st.composite
def argument_lists(draw) -> list[str]:
    """A subcommand, up to two positional values, then up to four of its flags each with up to two values (known
    names, bad ones, paths, numbers, or any text); --help is left out (tests/test_cli.py renders every page)."""
    command = draw(st.sampled_from(COMMANDS))
    value = st.one_of(st.sampled_from(VALUES), st.text(max_size=8))
    flag = st.sampled_from([o for o in _options(command) if o not in ("-h", "--help")])
    flags = draw(st.lists(st.tuples(flag, st.lists(value, max_size=2)), max_size=4))
    return [command, *draw(st.lists(value, max_size=2)), *(t for f, values in flags for t in (f, *values))]


# too_slow: an example is a whole command line's validation, which may import a technique's property modules (a
# second or more the first time); nested_given: those modules' @given run at their import (not a test nested in
# this one: nothing of theirs is executed here)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.nested_given])
@given(argv=argument_lists())
def test_any_argument_list_exits_with_a_documented_code_and_no_traceback(argv, no_work):
    """Generated argument lists for every subcommand: an exit code in the documented set (or the work reached,
    where the arguments were valid), no traceback, a usage error in one line, and no file written."""
    argv = [_fill(a, no_work) for a in argv]
    before = files_under(no_work)
    code, out, err = invoke(argv)
    hypothesis.event(f"{argv[0]}: {code}")
    assert code == "work" or code in EXIT_CODES, (argv, code, err[-2000:])
    assert "Traceback" not in out + err, (argv, err[-3000:])
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("harness"), (argv, err)
    assert files_under(no_work) == before, argv


# --- a plugin that cannot be loaded ---------------------------------------------------------------------------
UNLOADABLE = {  # plugin file -> (its source, what its one verdict line says)
    "syntax_error.py": ("import torch\n\n\ndef attention(q, k, v, *, causal=False, scale=None)\n    return q\n",
                        "could not be loaded: SyntaxError: expected ':' ({path}, line 4)"),
    "failing_import.py": ("import torch\nimport no_such_package_here\n",
                          "could not be loaded: ModuleNotFoundError: No module named 'no_such_package_here' ({path}, "
                          "line 2)"),
    "float17.py": ("from llm_inference_harness import declare\n\n\n@declare(dtypes=('float17',))\n"
                   "def attention(q, k, v, *, causal=False, scale=None):\n    return q\n",
                   "could not be loaded: ValueError: register('attention', 'attention'): dtypes ['float17'] are not "
                   "among ('float64', 'float32', 'bfloat16', 'float16') ({path}, line 4)"),
}


def test_a_plugin_that_cannot_be_loaded_gets_one_verdict_naming_file_line_and_exception(tmp_path):
    """Its first property's verdict says what its loading raised, where; the others are 'not run', said once; the
    exit code is 1 (the plugin's fault: its own code) and the verdict file records the failure."""
    specs = {}
    for name, (source, _) in UNLOADABLE.items():
        (tmp_path / name).write_text(source)
        specs[name] = f"{tmp_path / name}:attention"
    out = tmp_path / "verdicts.json"
    argv = ["check", "attention", *[a for spec in specs.values() for a in ("--plugin", spec)], "--property",
            "matches_reference", "--property", "rows_are_convex_combinations_of_values", "--property",
            "nan_inputs_propagate", "--jobs", "2", "--json", str(out)]
    code, printed, err = invoke(argv, work=True)
    assert code == 1, err[-3000:]
    document = json.loads(out.read_text())
    loaded = {i["target"]: i["load_error"] for i in document["implementations"]}
    for name, (_, says) in UNLOADABLE.items():
        spec, says = specs[name], says.format(path=tmp_path / name)
        first, *rest = [v for v in document["verdicts"] if v["impl"] == spec]
        assert (first["status"], first["message"]) == ("FAIL", says), first["message"]
        assert [(v["status"], v["message"]) for v in rest] == [("FAIL", "not run: the plugin could not be loaded")] * 2
        assert loaded[spec]["fault"] == "plugin" and loaded[spec]["file"] == str(tmp_path / name)
        assert printed.count(f"FAIL {spec} / ") == 1 and says in printed, printed[-3000:]
        assert printed.count(f"NOT RUN {spec}: 2 properties (rows_are_convex_combinations_of_values, "
                             "nan_inputs_propagate): the plugin could not be loaded") == 1, printed[-3000:]
    assert "Traceback" not in printed, printed[-3000:]
    assert "0 passed, 3 failed, 0 skipped, 6 not run" in printed, printed[-500:]


@pytest.mark.parametrize("attribute, says", [("nope", "has no attribute 'nope'; it defines attention"),
                                             ("LIMIT", "LIMIT is not a function or class (its type: int)")])
def test_a_plugin_spec_naming_nothing_loadable_is_the_commands_fault(attribute, says, tmp_path):
    """The file loads, the spec names nothing in it to check: a usage error (exit 2), the run stopped as for a typo."""
    plugin = tmp_path / "plugin.py"
    plugin.write_text("LIMIT = 3\n\n\ndef attention(q, k, v, *, causal=False, scale=None):\n    return q\n")
    code, out, err = invoke(["check", "attention", "--plugin", f"{plugin}:{attribute}", "--json",
                             str(tmp_path / "v.json")], work=True)
    assert_usage_error(code, out, err, says, ["check"])
    assert not (tmp_path / "v.json").exists()


# --- results written whole ------------------------------------------------------------------------------------
def test_a_failed_write_leaves_the_previous_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "v.json"
    path.write_text('{"previous": true}\n')
    path.chmod(0o640)
    with pytest.raises(RuntimeError), outputs.replacing(path) as tmp:
        tmp.write_text('{"half')
        raise RuntimeError("killed mid-write")
    assert path.read_text() == '{"previous": true}\n' and files_under(tmp_path) == {path}
    outputs.write_json(path, {"new": [1, 2]})
    assert json.loads(path.read_text()) == {"new": [1, 2]} and files_under(tmp_path) == {path}
    assert path.stat().st_mode & 0o777 == 0o640  # the replaced file's mode, not mkstemp's 0600


# --- the environment ------------------------------------------------------------------------------------------
BAD_ENVIRONMENT = [  # (variable, value, what the one line must say besides "NAME='VALUE': expected")
    ("HARNESS_IMPORT_LIMIT_S", "abc", "a number of seconds > 0"),
    ("HARNESS_IMPORT_LIMIT_S", "-1", "a number of seconds > 0"),
    ("HARNESS_IMPORT_LIMIT_S", "0", "a number of seconds > 0"),
    ("HARNESS_PER_IMPL_LIMIT_S", "", "a number of seconds > 0"),
    ("HARNESS_PER_IMPL_LIMIT_S", "inf", "a number of seconds > 0"),
    ("HARNESS_MEMORY_LIMIT_GB", "nan", "a number of GiB > 0"),
    ("HARNESS_MEMORY_LIMIT_GB", "4GB", "a number of GiB > 0"),
    ("HARNESS_DEVICES", "gpu", "a comma-separated list of cpu, cuda"),
    ("HARNESS_DEVICES", "", "a comma-separated list of cpu, cuda"),
    ("HARNESS_DEVICES", "cpu,", "a comma-separated list of cpu, cuda"),
    ("HARNESS_OUT", "", "a folder"),
    ("HARNESS_ENTRY_POINTS", "a,,b", "comma-separated names"),
    ("HARNESS_TRUSTED_IN_PROCESS", "yes", "0 or 1"),
    ("HARNESS_EXAMPLE_DB", "localhost:6379", "redis://HOST:PORT/DB"),
    ("HARNESS_EXAMPLE_DB_WRITE", "true", "0 or 1"),
    ("HARNESS_EXAMPLE_DB_LOCAL", " ", "a folder"),
]


@pytest.mark.parametrize("command", [["check", "attention", "--impl", "naive"], ["run"], ["report"], ["list"]],
                         ids=lambda c: c[0])
@pytest.mark.parametrize("name, value, says", BAD_ENVIRONMENT, ids=[f"{n}={v!r}" for n, v, _ in BAD_ENVIRONMENT])
def test_a_bad_environment_variable_is_one_line_and_exit_2_before_any_work(name, value, says, command, no_work,
                                                                          monkeypatch):
    monkeypatch.setenv(name, value)
    before = files_under(no_work)
    code, out, err = invoke(command)
    assert_usage_error(code, out, err, f"{name}={value!r}: expected {says}", command)
    assert files_under(no_work) == before


@pytest.mark.parametrize("name, value", [("HARNESS_IMPORT_LIMIT_S", "5"), ("HARNESS_PER_IMPL_LIMIT_S", "0.5"),
                                         ("HARNESS_MEMORY_LIMIT_GB", "1e3"), ("HARNESS_DEVICES", "cpu,cuda"),
                                         ("HARNESS_TRUSTED_IN_PROCESS", "0"), ("HARNESS_EXAMPLE_DB_WRITE", "1")])
def test_a_good_environment_variable_reaches_the_work(name, value, no_work, monkeypatch):
    monkeypatch.setenv(name, value)
    assert invoke(["check", "attention", "--impl", "naive"])[0] == "work"


def test_the_variables_are_read_when_used_with_their_documented_defaults(monkeypatch):
    """Nothing reads one at import (a bad value would be a traceback before the command line could name it): the
    readers read it each time, validated, and unset means the default README.md documents."""
    from llm_inference_harness.engine import devices, environment, isolation

    for name in environment.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert (runner.import_limit_s(), isolation.Limits().total_s, devices.only()) == (180.0, 900.0, ())
    assert not runner.trusted_in_process()
    monkeypatch.setenv("HARNESS_IMPORT_LIMIT_S", "7.5")
    monkeypatch.setenv("HARNESS_MEMORY_LIMIT_GB", "2")
    assert (runner.import_limit_s(), isolation.Limits().memory_bytes) == (7.5, 2 * 2**30)
    for name, reader in [("HARNESS_IMPORT_LIMIT_S", runner.import_limit_s), ("HARNESS_PER_IMPL_LIMIT_S",
                         isolation.Limits), ("HARNESS_MEMORY_LIMIT_GB", isolation.default_memory_limit)]:
        monkeypatch.setenv(name, "nan")
        with pytest.raises(environment.BadVariable, match=f"^{name}='nan': expected a number"):
            reader()
    monkeypatch.setenv("HARNESS_OUT", "")
    with pytest.raises(environment.BadVariable, match="^HARNESS_OUT='': expected a folder"):
        provenance.output_root()


def test_a_bad_variable_is_pytests_usage_error_in_another_projects_session(tmp_path):
    """The pytest plugin checks the HARNESS_* variables as the command line does: one line, exit 4 (pytest's usage
    error), no test run and no traceback."""
    run = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "llm_inference_harness.properties.test_attention",
                          "-q", "-p", "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HARNESS_TRUSTED_IN_PROCESS": "yes"})
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "HARNESS_TRUSTED_IN_PROCESS='yes': expected 0 or 1" in run.stderr and "Traceback" not in run.stderr
