"""The report reads each benchmark case from the newest asv run of one machine that measured it at the current
version, this machine's by default, and says which machine and commit each value came from."""

import json
import math

import pytest

import llm_inference_harness.bench.report.asvdata as asvdata
from llm_inference_harness.engine import provenance

BENCH = "bench_x.Case.track_value"
COLUMNS = ["result", "params", "version", "stats_q_25", "stats_q_75"]


def run_file(path, date, version, result, q=None):
    data = {"commit_hash": path.stem * 5, "date": date, "params": {"machine": path.parent.name}, "version": 2,
            "result_columns": COLUMNS,
            "results": {BENCH: [result, [["'a'", "'b'"], ["'cpu'", "'cuda'"]], version, *(q or (None, None))]}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))  # NaN as asv writes it


@pytest.fixture
def results(tmp_path, monkeypatch):
    committed, local = tmp_path / "results", tmp_path / "local"
    monkeypatch.setattr(asvdata, "RESULTS", committed)
    monkeypatch.setattr(asvdata, "roots", lambda: [local, committed])
    monkeypatch.setattr(asvdata, "current_versions", lambda: {BENCH: "v2"})  # the suite as asv would discover it
    committed.mkdir()
    return committed, local


def test_each_case_from_its_newest_run_at_the_current_version(results):
    committed, _ = results
    nan = math.nan
    run_file(committed / "vm" / "old.json", 1, "v2", [1.0, nan, 2.0, nan])  # every cpu case
    run_file(committed / "vm" / "partial.json", 2, "v2", [nan, nan, 3.0, nan])  # only (b, cpu) rerun
    run_file(committed / "vm" / "stale.json", 4, "v1", [9.0, 9.0, 9.0, 9.0])  # the benchmark's old code
    run_file(committed / "gpu" / "run.json", 3, "v2", [nan, 4.0, nan, 5.0])  # another machine: not mixed in
    vm = asvdata.values(BENCH, "vm")
    assert vm == {("a", "cpu"): 1.0, ("b", "cpu"): 3.0}
    assert vm.sources[("b", "cpu")].commit.startswith("partial") and vm.sources[("a", "cpu")].commit.startswith("old")
    assert asvdata.values(BENCH, "gpu") == {("a", "cuda"): 4.0, ("b", "cuda"): 5.0}


def test_this_machine_by_default_its_own_runs_before_committed_ones(results):
    committed, local = results
    here = provenance.machine_name()
    run_file(committed / here / "backfill.json", 1, "v2", [1.0, None, 2.0, None], q=([0.9, None, 1.8, None],
                                                                                    [1.1, None, 2.2, None]))
    run_file(local / here / "quick.json", 2, "v2", [1.5, None, None, None])
    run_file(committed / "other-machine" / "run.json", 3, "v2", [7.0, 7.0, 7.0, 7.0])
    got = asvdata.values(BENCH)
    assert got == {("a", "cpu"): 1.5, ("b", "cpu"): 2.0}
    assert not got.sources[("a", "cpu")].committed and got.sources[("b", "cpu")].committed
    assert got.spread == {("b", "cpu"): (1.8, 2.2)}  # the local run recorded none for its case
    assert here in got.where() and "this machine's run" in got.where()


def test_no_run_at_the_current_version_says_so(results):
    committed, _ = results
    run_file(committed / "vm" / "stale.json", 1, "v1", [9.0, 9.0, 9.0, 9.0])
    with pytest.raises(NotImplementedError, match=BENCH):
        asvdata.values(BENCH, "vm")


def test_forward_ratios_pair_each_case_with_sdpa_of_the_same_run():
    from llm_inference_harness.bench.report.sections import forward_ratios

    times = asvdata.Values()
    for (impl, shape), (t, commit) in {("sdpa", "1x8x512x64"): (1.0, "a"), ("fa2", "1x8x512x64"): (3.0, "a"),
                                       ("sdpa", "1x8x128x64"): (1.0, "a"), ("fa2", "1x8x128x64"): (2.0, "b")}.items():
        key = (impl, "cpu", shape, True)
        times[key], times.sources[key] = t, asvdata.Source("vm", commit, True)
    assert forward_ratios(times) == {"fa2": {512: 3.0}}  # at N=128 the two come from different runs: no ratio


def test_a_figure_with_more_series_than_a_panel_holds_is_faceted(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from llm_inference_harness.bench.report.document import MAX_SERIES, Report
    from llm_inference_harness.bench.report.sections import _groups, ratio_figure

    names = [f"fa2_v{i}" for i in range(MAX_SERIES + 2)]
    panels = _groups(names, "tiled")
    assert [len(n) for _, n in panels] == [MAX_SERIES, 2]
    report = Report(tmp_path, here="vm at abc, 2026-01-01")
    report.figure(ratio_figure({n: {512: 1.0 + i, 2048: 2.0 + i} for i, n in enumerate(names)}, panels), "f", "c",
                  "vm at abc, 2026-01-01")
    assert (tmp_path / "f.png").is_file()
    with pytest.raises(ValueError, match="series in one panel"):
        report.figure(ratio_figure({n: {512: 1.0} for n in names}, [("all", names)]), "g", "c", "vm")
