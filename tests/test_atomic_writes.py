"""A result file is written whole or not at all, however the run ends: a writer, `harness check --json`, asv's
own result writes and the mutants' log, each killed at moments drawn over its run (harness/engine/outputs.py,
harness/bench/asvrun.staged)."""

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_inference_harness.bench import asvrun
from llm_inference_harness.engine import inputs

ROOT = Path(__file__).resolve().parents[1]


_WRITER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("outputs", sys.argv[1])
outputs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(outputs)
n = 0
while True:
    n += 1
    outputs.write_json(sys.argv[2], {"n": n, "pad": "x" * 4_000_000, "whole": True})
"""


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


def test_a_writer_killed_mid_write_leaves_the_old_file_or_the_new_one(tmp_path):
    """A process writing a 4 MB document over and over through llm_inference_harness.engine.outputs, SIGKILLed at random
    moments: the file always parses and is whole.  (Path.write_text in its place leaves a partial file in most
    of these kills.)"""
    path = tmp_path / "doc.json"
    rng = random.Random(0)
    script = [sys.executable, "-c", _WRITER, str(ROOT / "harness" / "engine" / "outputs.py"), str(path)]
    for _ in range(12):
        proc = subprocess.Popen(script)
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        proc.kill()
        proc.wait()
        assert json.loads(path.read_text())["whole"] is True


def _checking_children(pid: int) -> set[int]:
    ps = subprocess.run(["ps", "-eo", "pid=,ppid=,sid="], capture_output=True, text=True).stdout
    return {int(p) for p, parent, sid in (line.split() for line in ps.splitlines()) if int(parent) == pid
            and sid == p}


# Imports the harness, the implementations and attention's properties once, then for each "go" line it reads runs
# `main(ARGV)` in a forked copy of itself and prints that copy's pid; at the next line it waits for the copy to end
# and prints "done".  A run costs its check, not the imports.
_FORKER = """
import json, os, sys
from llm_inference_harness.engine import profiles, runner
from llm_inference_harness.cli import main
from llm_inference_harness.engine.registry import load_all
argv = json.loads(sys.argv[1])
profiles.load("dev")  # before the property modules are imported: their settings read it
load_all()
runner.properties_of("attention")
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        os._exit(main(argv))
    print(pid, flush=True)
    sys.stdin.readline()  # reaped only when told: until then its pid stays its own, even once it has ended
    os.waitpid(pid, 0)
    print("done", flush=True)
"""


def test_check_killed_at_random_moments_never_leaves_a_partial_json(tmp_path):
    """`check --json F` killed (SIGKILL or SIGTERM) at random moments of its run, F holding a previous document:
    F is afterwards the previous document or a whole new one, never part of one."""
    path = tmp_path / "v.json"
    previous = {"previous": True}
    argv = ["check", "attention", "--impl", "naive", "--property", "rows_are_convex_combinations_of_values",
            "--profile", "dev", "--jobs", "1", "--json", str(path)]
    forker = subprocess.Popen([sys.executable, "-c", _FORKER, json.dumps(argv)], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def say(line: str) -> str:
        forker.stdin.write(line + "\n")
        forker.stdin.flush()
        return forker.stdout.readline()

    try:
        durations = []
        for _ in range(2):  # the first run is slower (cold caches): the kills are drawn over a warm run's length
            started = time.monotonic()
            say("go")
            assert say("reap") == "done\n"
            durations.append(time.monotonic() - started)
            assert json.loads(path.read_text())["verdicts"][0]["status"] == "pass"
        duration = min(durations)
        rng, outcomes = random.Random(0), []
        for sig in [signal.SIGKILL, signal.SIGTERM] * 3:
            path.write_text(json.dumps(previous))
            pid = int(say("go"))
            time.sleep(rng.uniform(0.0, 1.2) * duration)
            os.kill(pid, signal.SIGSTOP)  # frozen while its checking processes are listed (a zombie takes it too)
            children = _checking_children(pid)
            os.kill(pid, sig)
            os.kill(pid, signal.SIGCONT)
            assert say("reap") == "done\n"
            # each leads its own process group (llm_inference_harness.engine.isolation); the harness is gone
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child, signal.SIGKILL)
            document = json.loads(path.read_text())
            assert document == previous or document["verdicts"][0]["status"] == "pass", document
            outcomes.append("previous" if document == previous else "new")
    finally:
        forker.stdin.close()
        forker.wait(timeout=60)
    assert "previous" in outcomes, f"no kill landed before the write ({outcomes}): the test says nothing"


# --- asv's results written whole ------------------------------------------------------------------------------
ASV_FILE = "vm/abcdef12-env.json"
_ASV_WRITER = """
import sys
from asv.util import write_json  # how asv writes a result file: open(path, "w"), then one json.dump
path = sys.argv[1]
n = 0
while True:
    n += 1
    write_json(path, {"n": n, "pad": "x" * 4_000_000, "whole": True}, api_version=2, compact=True)
"""


def _asv_results(tmp_path: Path) -> Path:
    results = tmp_path / "asv"
    (results / "vm").mkdir(parents=True)
    (results / "vm" / "machine.json").write_text('{"machine": "vm", "version": 1}')
    (results / ASV_FILE).write_text('{"previous": true}')
    return results


def test_asv_killed_mid_write_leaves_the_previous_results_file_or_the_new_one(tmp_path):
    """asv's own writer (asv.util.write_json, in place) writing a 4 MB result over and over into the staging folder
    of llm_inference_harness.bench.asvrun, SIGKILLed at random moments: the file kept is the previous one (asv's copy
    was torn: not kept) or a whole new one, never part of one, and no staging folder is left."""
    results, rng, outcomes = _asv_results(tmp_path), random.Random(0), []
    for _ in range(5):
        with asvrun.staged(results, "vm") as stage:
            staged = stage / ASV_FILE
            assert staged.read_text() == (results / ASV_FILE).read_text()  # asv merges a run into the commit's file
            before = staged.stat().st_mtime_ns
            proc = subprocess.Popen([sys.executable, "-c", _ASV_WRITER, str(staged)])
            deadline = time.monotonic() + 60
            while staged.stat().st_mtime_ns == before and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.2))
            proc.kill()
            proc.wait()
        document = json.loads((results / ASV_FILE).read_text())
        assert document.get("whole") is True or document == {"previous": True}, document
        outcomes.append("new" if document.get("whole") else "previous")
        (results / ASV_FILE).write_text('{"previous": true}')
        assert sorted(p.name for p in tmp_path.iterdir()) == ["asv"], "a staging folder was left"
    assert "previous" in outcomes, f"no kill landed mid-write ({outcomes}): the test says nothing"


_KILLED_HARNESS = """
import sys, time
from pathlib import Path
from llm_inference_harness.bench import asvrun
with asvrun.staged(Path(sys.argv[1]), "vm") as stage:
    (stage / "vm" / "abcdef12-env.json").write_text('{"new": tr')  # asv mid-write when the harness is killed
    print("writing", flush=True)
    time.sleep(60)
"""


def test_a_harness_killed_during_asv_leaves_the_results_folder_as_it_was(tmp_path):
    """Killed while asv runs: the results folder is untouched; the next asv call removes the abandoned staging
    folder (its process gone) and keeps nothing from it."""
    results = _asv_results(tmp_path)
    before = {p: p.read_bytes() for p in files_under(results)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_HARNESS, str(results)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "writing\n"
    proc.kill()
    proc.wait()
    assert {p: p.read_bytes() for p in files_under(results)} == before
    assert len([p for p in tmp_path.iterdir() if p.name != "asv"]) == 1  # the killed run's staging folder
    with asvrun.staged(results, "vm"):
        assert len(list(tmp_path.iterdir())) == 2  # the abandoned one removed, this call's own there
    assert [p.name for p in tmp_path.iterdir()] == ["asv"]
    assert {p: p.read_bytes() for p in files_under(results)} == before


def test_the_mutants_log_reads_past_a_torn_last_line_and_appends_after_cutting_it(tmp_path):
    """results.jsonl (machine-made mutants, resumable) is appended a line per record: a run killed mid-append
    leaves a torn last line, which a resumed run leaves out (that unit is judged again) and cuts off."""
    from llm_inference_harness.engine import mutation

    log = tmp_path / "results.jsonl"
    log.write_text('{"key": 1}\n{"key": 2}\n{"key": 3, "verd')
    assert mutation.read_results(log) == [{"key": 1}, {"key": 2}]
    mutation._append(log, {"key": 3})
    assert log.read_text() == '{"key": 1}\n{"key": 2}\n{"key": 3}\n'
    assert mutation.read_results(log) == [{"key": 1}, {"key": 2}, {"key": 3}]
    log.write_text('{"key": 1}\nnot json\n{"key": 2}\n')
    with pytest.raises(inputs.BadFile, match=r"results.jsonl: line 2 is not a JSON record"):
        mutation.read_results(log)
