"""llm_inference_harness.bench.history: which commits a backfill picks, and result files that keep one series per
machine."""

import json

from llm_inference_harness.bench import history


def test_spread_keeps_both_ends_and_spaces_evenly():
    commits = [f"c{i}" for i in range(160)]
    picked = history.spread(commits, 48)
    assert len(picked) == len(set(picked)) == 48 and picked[0] == "c0" and picked[-1] == "c159"
    gaps = {commits.index(b) - commits.index(a) for a, b in zip(picked, picked[1:], strict=False)}
    assert gaps <= {3, 4}
    assert history.spread(commits[:5], 48) == commits[:5]


def test_coarse_to_fine_spans_the_range_at_every_prefix():
    commits = [f"c{i}" for i in range(48)]
    order = history.coarse_to_fine(commits)
    assert sorted(order) == sorted(commits) and order[:3] == ["c0", "c47", "c24"]
    first = sorted(commits.index(c) for c in order[:9])  # the first nine: eighths of the range
    assert max(b - a for a, b in zip(first, first[1:], strict=False)) <= 6


def entry(result, version="v1"):
    n = len(result)
    return [result, [[repr(i) for i in range(n)]], version, 0, 1.0, None, None, [None] * n, [None] * n,
            [None] * n, [None] * n, [None] * n, None]


def document(results, python="/some/venv/bin/python", machine="old-name"):
    return {"commit_hash": "ab" * 20, "env_name": "existing-py_some_venv", "date": 1, "python": python,
            "requirements": {"torch": "2.13.0"}, "params": {"machine": machine, "cpu": "?", "python": python,
                                                             "torch": "2.13.0", "ram": "25276510208"},
            "env_vars": {}, "result_columns": history.COLUMNS, "results": results, "durations": {}, "version": 2}


def test_merge_keeps_the_cases_a_later_run_did_not_measure():
    old = document({"b.C.track": entry([1.0, 2.0, 3.0]), "b.C.other": entry([5.0])})
    new = document({"b.C.track": entry([None, 20.0, float("nan")])})
    merged = history.merge(old, new)
    assert merged["results"]["b.C.track"][0] == [1.0, 20.0, 3.0]
    assert merged["results"]["b.C.other"][0] == [5.0]
    stale = document({"b.C.track": entry([None, 7.0, None], version="v2")})  # new benchmark code: no mixing
    assert history.merge(old, stale)["results"]["b.C.track"][0] == [None, 7.0, None]


def test_normalize_gives_files_their_machine_fields_and_interpreter_version(tmp_path):
    folder = tmp_path / "xeon-amx-2c-24g"
    folder.mkdir()
    machine = {"machine": "xeon-amx-2c-24g", "cpu": "Intel(R) Xeon(R) Processor (amx)", "ram": "24 GiB",
               "gpu": "none", "num_cpu": "2", "arch": "x86_64", "os": "Linux"}
    (folder / "machine.json").write_text(json.dumps({**machine, "version": 1}))
    (folder / "abababab-existing-py_some_venv.json").write_text(json.dumps(document({"b.C.t": entry([1.0])})))
    assert history.normalize(tmp_path, python="3.11") == 1
    (path,) = [p for p in folder.glob("*.json") if p.name != "machine.json"]
    data = json.loads(path.read_text())
    assert data["python"] == data["params"]["python"] == "3.11"
    assert {k: data["params"][k] for k in machine} == machine
    assert path.name == f"abababab-{data['env_name']}.json" and "/" not in data["env_name"]
    assert history.normalize(tmp_path, python="3.11") == 0  # idempotent


def line(values, machine="vm"):
    """A committed series as llm_inference_harness.bench.steps reads it: one point per commit, in date order."""
    from llm_inference_harness.bench.results import Point

    return {("b.C.track", machine, "env", ("cpu",)): [
        Point("b.C.track", machine, ("cpu",), f"c{i:02d}", "env", i, v, None, None, 1, "v", True)
        for i, v in enumerate(values)]}


def test_steps_finds_a_level_that_moves_and_only_there():
    from llm_inference_harness.bench.steps import candidates

    noise = [1.00, 1.03, 0.98, 1.02, 0.99, 1.01, 0.97]
    (step,) = candidates(line(noise + [1.3 * v for v in noise]))
    assert (step.before, step.after) == ("c06", "c07") and 1.25 < step.step < 1.35 and step.p_value < 0.01
    assert candidates(line(noise * 2)) == []  # noise alone moves no level
    assert candidates(line(noise + [1.05 * v for v in noise])) == []  # a move under MIN_STEP is not a candidate


def test_steps_compares_the_exact_case():
    import re

    from llm_inference_harness.bench.steps import case_regex

    name = "bench_kvcache.CachedVsRecompute.track_recompute_over_cached"
    pattern = case_regex(name, ("concat", "cpu", 512, 256))
    assert re.search(pattern, f"{name}('concat', 'cpu', 512, 256)")
    assert not re.search(pattern, f"{name}('concat', 'cpu', 51, 256)") and not re.search(pattern, f"x{name}")
