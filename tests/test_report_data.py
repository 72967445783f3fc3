"""The report reads each benchmark case from the newest asv run that measured it at the current version."""

import json
import math

import pytest

import harness.report.asvdata as asvdata

BENCH = "bench_x.Case.track_value"
COLUMNS = ["result", "params", "version"]


def run_file(path, date, machine, version, result):
    data = {"date": date, "params": {"machine": machine}, "result_columns": COLUMNS,
            "results": {BENCH: [result, [["'a'", "'b'"], ["'cpu'", "'cuda'"]], version]}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))  # NaN as asv writes it


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(asvdata, "RESULTS", tmp_path)
    asvdata._files.cache_clear()
    asvdata.current_versions.cache_clear()
    (tmp_path / "benchmarks.json").write_text(json.dumps({BENCH: {"version": "v2"}, "version": 2}))
    yield tmp_path
    asvdata._files.cache_clear()
    asvdata.current_versions.cache_clear()


def test_each_case_from_its_newest_run_at_the_current_version(results):
    nan = math.nan
    run_file(results / "vm" / "old.json", 1, "vm", "v2", [1.0, nan, 2.0, nan])  # every cpu case
    run_file(results / "vm" / "partial.json", 2, "vm", "v2", [nan, nan, 3.0, nan])  # only (b, cpu) rerun
    run_file(results / "gpu" / "run.json", 3, "gpu", "v2", [nan, 4.0, nan, 5.0])  # the cuda cases
    run_file(results / "vm" / "stale.json", 4, "vm", "v1", [9.0, 9.0, 9.0, 9.0])  # the benchmark's old code
    assert asvdata.values(BENCH) == {("a", "cpu"): 1.0, ("b", "cpu"): 3.0, ("a", "cuda"): 4.0, ("b", "cuda"): 5.0}


def test_no_run_at_the_current_version_says_so(results):
    run_file(results / "vm" / "stale.json", 1, "vm", "v1", [9.0, 9.0, 9.0, 9.0])
    with pytest.raises(NotImplementedError, match=BENCH):
        asvdata.values(BENCH)
