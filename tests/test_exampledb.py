"""The shared example database (harness/engine/exampledb.py) on a real Redis server: a failure one process
finds is replayed first by another, which reads the server and writes only its own folder.

Each test module run starts `redis-server` (Debian's package; .ci/run installs it) on a free 127.0.0.1 port and
stops it.  Where it is absent the tests skip, saying so."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

redis = pytest.importorskip("redis", reason="the redis client is not installed (pip install -e '.[test]')")
pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server is not installed (apt-get install -y redis-server)")

ROOT = Path(__file__).resolve().parents[1]
# a mutant whose declared killer fails within a second at the ci profile: truncation instead of rounding
CASE = ["check", "quantization", "--impl", "mutant_truncation", "--property", "error_within_half_step", "--jobs", "1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", client
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _check(tmp_path: Path, name: str, *args: str) -> dict:
    """A check in its own process with its own local example folder; its verdict."""
    env = {**os.environ, "HARNESS_EXAMPLE_DB_LOCAL": str(tmp_path / f"{name}-examples")}
    env.pop("HARNESS_EXAMPLE_DB", None)
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-m", "llm_inference_harness", *CASE, *args, "--json", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]  # a mutant's failure fails no check
    (verdict,) = json.loads(out.read_text())["verdicts"]
    assert verdict["status"] == "FAIL", verdict
    return verdict


def _entries(client) -> dict[bytes, set[bytes]]:
    return {key: client.smembers(key) for key in client.keys(b"harness-example:*")}


def test_a_failure_found_in_one_process_is_replayed_first_in_another(server, tmp_path):
    """The writer shrinks its failure and saves it; a reader that does not shrink reports the first failing
    example it ran, which is the writer's minimal one -- where on its own it reports another, as found."""
    url, client = server
    found = _check(tmp_path, "writer", "--example-db", url, "--example-db-write")
    saved = _entries(client)
    assert saved and all(k.startswith(b"harness-example:quantization/mutant_truncation/") for k in saved), saved
    alone = _check(tmp_path, "alone", "--no-shrink")
    assert alone["counterexample"] != found["counterexample"], "the case cannot tell a replay from a fresh find"
    replayed = _check(tmp_path, "reader", "--no-shrink", "--example-db", url)
    assert replayed["counterexample"] == found["counterexample"]
    assert replayed["reproduce"].split("--reproduce ")[1] == found["reproduce"].split("--reproduce ")[1]
    assert _entries(client) == saved, "a reader wrote to the shared database"
    assert any((tmp_path / "reader-examples").rglob("*")), "the reader kept nothing locally"


def test_an_unreachable_server_is_a_usage_error(capsys):
    from llm_inference_harness.cli import main

    url = f"redis://127.0.0.1:{_free_port()}/0"
    assert main([*CASE, "--example-db", url]) == 2
    assert f"--example-db {url}: cannot use it" in capsys.readouterr().err


def test_each_implementation_keeps_its_own_examples(server, monkeypatch, tmp_path):
    """A property's key is the same for every implementation, and Hypothesis deletes an example that no longer
    fails: scoped by implementation, a correct one's run cannot erase what a buggy one left."""
    from llm_inference_harness.engine import exampledb
    from llm_inference_harness.engine.runner import Target

    url, client = server
    monkeypatch.setenv(exampledb.URL, url)
    monkeypatch.setenv(exampledb.WRITE, "1")
    monkeypatch.setenv(exampledb.LOCAL, str(tmp_path / "examples"))
    db = exampledb.from_environment()
    with exampledb.scoped(Target("attention", name="buggy")):
        db.save(b"property-key", b"failing example")
    with exampledb.scoped(Target("attention", name="correct")):
        assert list(db.fetch(b"property-key")) == []
        db.delete(b"property-key", b"failing example")  # what replaying it and passing does
    with exampledb.scoped(Target("attention", name="buggy")):
        assert list(db.fetch(b"property-key")) == [b"failing example"]
    assert client.smembers(b"harness-example:attention/buggy/property-key") == {b"failing example"}
