"""Shards with no engine (harness/engine/units.py, harness/engine/merge.py): the plan cuts a run's units into
contiguous parts of about equal expected time, every unit in exactly one; `harness merge` joins the shards'
documents into the unsharded run's and refuses shards that are not one run.  No server: the Ray and Redis tests
are tests/test_cluster.py and tests/test_exampledb.py."""

import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.cli import main
from llm_inference_harness.engine import units as engine_units
from llm_inference_harness.engine.merge import MergeError, merge
from llm_inference_harness.engine.runner import Target
from llm_inference_harness.engine.units import Durations, Shard, Unit, plan, recorded_seconds

SUBSET = ["--impl", "naive", "--impl", "fa2_17x33", "--impl", "mutant_unscaled_scores", "--property",
          "scores_1000_999_998_10", "--property", "empty_shapes_give_empty_output", "--property", "rejects_bad_input"]


def _units(n: int) -> list[Unit]:
    return [Unit("attention", Target("attention", name=f"impl{i // 3}"), f"prop{i % 3}") for i in range(n)]


@given(seconds=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=60), count=st.integers(1, 8))
def test_the_plan_puts_every_unit_in_one_shard_in_order_and_balanced(seconds, count):
    """Concatenated in shard order the shards are the units in order (each once); each shard's expected time is
    within one unit's of an equal share."""
    units = _units(len(seconds))
    durations = Durations({u.key: s for u, s in zip(units, seconds, strict=True)}, source="test")
    shards = [plan(units, Shard(i, count), durations) for i in range(1, count + 1)]
    assert [u for p in shards for u in p.units] == units
    share, largest = sum(seconds) / count, max(seconds)
    for p in shards:
        assert abs(sum(durations.expected(u) for u in p.units) - share) <= largest + 1e-9, (p.record, share)
    assert len({p.record["plan"] for p in shards}) == 1 and {p.record["total_units"] for p in shards} == {len(units)}


def test_a_unit_without_a_recorded_time_gets_its_techniques_mean_else_the_estimate():
    units = _units(4)
    durations = Durations({units[0].key: 1.0, units[1].key: 3.0, units[2].key: 8.0})
    assert durations.expected(units[1]) == 3.0 and durations.expected(units[3]) == 4.0
    mutant = Unit("kvcache", Target("kvcache", name="m"), killers=2)
    assert Durations().expected(units[0]) == engine_units.CHECK_ESTIMATE_S + engine_units.UNIT_START_S
    assert Durations().expected(mutant) == 2 * engine_units.MUTANT_ESTIMATE_S + engine_units.UNIT_START_S


@pytest.mark.parametrize("text", ["0/3", "4/3", "3", "a/b", "1/0", "1/3/5"])
def test_a_bad_shard_is_a_usage_error(text, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["check", "attention", "--shard", text])
    assert exit_.value.code == 2
    assert f"--shard must be I/N with 1 <= I <= N (shard I of N), got {text!r}" in capsys.readouterr().err


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict:
    """A check of two implementations and a mutant over three properties, whole and in three shards."""
    folder = tmp_path_factory.mktemp("shards")
    codes = {}
    for name, extra in [("whole", []), *((f"shard{i}", ["--shard", f"{i}/3"]) for i in (1, 2, 3))]:
        codes[name] = main(["check", "attention", *SUBSET, "--jobs", "1", "--json", str(folder / f"{name}.json"),
                            *extra])
    documents = {name: json.loads((folder / f"{name}.json").read_text()) for name in codes}
    return {"codes": codes, "documents": documents, "folder": folder}


def _verdicts(document: dict) -> list[tuple]:
    return [(v["impl"], v["property"], v["status"], v["message"], v["counterexample"], v["reproduce"])
            for v in document["verdicts"]]


def test_three_shards_merged_are_the_unsharded_run(shards, capsys):
    folder, whole = shards["folder"], shards["documents"]["whole"]
    code = main(["merge", str(folder / "merged.json"), *(str(folder / f"shard{i}.json") for i in (3, 1, 2))])
    merged = json.loads((folder / "merged.json").read_text())
    assert _verdicts(merged) == _verdicts(whole) and merged["implementations"] == whole["implementations"]
    assert ("mutant_unscaled_scores", "rejects_bad_input", "FAIL") in [v[:3] for v in _verdicts(merged)]
    assert code == shards["codes"]["whole"] == 0, capsys.readouterr()  # a mutant's failure fails no check
    assert [s["index"] for s in merged["shards"]] == [1, 2, 3] and "shard" not in merged
    assert all(shards["documents"][f"shard{i}"]["shard"]["units"] for i in (1, 2, 3)), "a shard was left empty"


def _refused(documents: list[tuple[str, dict]]) -> str:
    with pytest.raises(MergeError) as refused:
        merge(documents)
    return str(refused.value)


def test_merge_refuses_shards_that_are_not_one_run(shards):
    docs = [(f"shard{i}.json", shards["documents"][f"shard{i}"]) for i in (1, 2, 3)]
    assert "missing shard(s) 2/3" in _refused([docs[0], docs[2]])
    assert "shard 1/3 given twice: shard1.json and again.json" in _refused([*docs, ("again.json", docs[0][1])])
    assert "not a shard's document" in _refused([("whole.json", shards["documents"]["whole"]), *docs])
    for field, value, says in [("commit", "0123456789ab", "different commits"), ("profile", "dev", "different "
                               "profiles"), ("technique", "kvcache", "different techniques")]:
        other = copy.deepcopy(docs[1][1])
        other[field] = value
        assert says in _refused([docs[0], ("other.json", other), docs[2]])
    overlapping = copy.deepcopy(docs[1][1])
    overlapping["shard"]["units"].append(docs[0][1]["shard"]["units"][0])
    assert "is in two shards: shard1.json and other.json" in _refused([docs[0], ("other.json", overlapping), docs[2]])
    short = copy.deepcopy(docs[1][1])
    short["shard"]["units"].pop()
    assert "some are missing" in _refused([docs[0], ("other.json", short), docs[2]])
    replanned = copy.deepcopy(docs[1][1])
    replanned["shard"]["plan"] = "sha256:0"
    assert "different plans" in _refused([docs[0], ("other.json", replanned), docs[2]])


def test_a_refused_merge_exits_2_with_one_line(shards, capsys):
    folder = shards["folder"]
    code = main(["merge", str(folder / "refused.json"), str(folder / "shard1.json"), str(folder / "shard3.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("harness merge: missing shard(s) 2/3") and err.count("\n") == 1
    assert not (folder / "refused.json").exists()


def test_a_previous_run_balances_the_next(shards):
    """The unsharded document's times are the durations: every unit recorded, the shards' plan follows them."""
    whole = shards["documents"]["whole"]
    recorded = recorded_seconds(whole)
    assert len(recorded) == 9 and all(key[:2] == ("check", "attention") for key in recorded)
    assert recorded[("check", "attention", "naive", "rejects_bad_input")] == pytest.approx(
        engine_units.UNIT_START_S + next(v["seconds"] for v in whole["verdicts"] if v["impl"] == "naive"
                            and v["property"] == "rejects_bad_input"))


def test_run_folders_merge_file_by_file(shards, tmp_path):
    """`run --shard` writes a folder of documents per shard: merged folder by folder, file by file."""
    for i in (1, 2, 3):
        (tmp_path / f"shard{i}").mkdir()
        (tmp_path / f"shard{i}" / "attention.json").write_text(json.dumps(shards["documents"][f"shard{i}"]))
    assert main(["merge", str(tmp_path / "merged"), *(str(tmp_path / f"shard{i}") for i in (1, 2, 3))]) == 0
    merged = json.loads((tmp_path / "merged" / "attention.json").read_text())
    assert _verdicts(merged) == _verdicts(shards["documents"]["whole"])


def test_mutants_in_two_shards_merged_are_the_unsharded_run(tmp_path):
    """The block manager's mutants (each a unit: its declared killers first, stopping at the first kill)."""
    codes = {}
    for name, extra in [("whole", []), ("shard1", ["--shard", "1/2"]), ("shard2", ["--shard", "2/2"])]:
        codes[name] = main(["mutants", "block_manager", "--jobs", "1", "--json", str(tmp_path / f"{name}.json"),
                            *extra])
    from llm_inference_harness.engine.registry import impls

    shard_docs = [json.loads((tmp_path / f"shard{i}.json").read_text()) for i in (1, 2)]
    registered = len(impls("block_manager", mutants=True))
    assert all(d["shard"]["units"] for d in shard_docs) and shard_docs[0]["shard"]["total_units"] == registered
    assert main(["merge", str(tmp_path / "merged.json"), *(str(tmp_path / f"shard{i}.json") for i in (1, 2))]) == 0
    whole, merged = (json.loads((tmp_path / f"{n}.json").read_text())["techniques"][0] for n in ("whole", "merged"))
    assert _verdicts(merged) == _verdicts(whole) and merged["implementations"] == whole["implementations"]
    assert codes == {"whole": 0, "shard1": 0, "shard2": 0}


@given(count=st.integers(1, 12), targets=st.integers(1, 20), jobs=st.integers(1, 8))
def test_a_check_cuts_its_properties_into_parts_each_property_once(count, targets, jobs):
    """`runner._parts`: every property in exactly one part, the first (a technique's state machines, the costliest)
    in different parts; at least two children per worker in all, unless every property has its own part, and no
    more parts than that takes; one part with one worker."""
    from llm_inference_harness.engine.runner import _parts

    names = [f"prop{i}" for i in range(count)]
    parts = _parts(names, targets, jobs)
    assert sorted(n for part in parts for n in part) == sorted(names) and all(parts)
    assert [part[0] for part in parts] == names[:len(parts)]
    if jobs == 1:
        assert len(parts) == 1
    else:
        assert len(parts) == count or len(parts) * targets >= 2 * jobs
        assert len(parts) == 1 or (len(parts) - 1) * targets < 2 * jobs


def test_one_implementation_checked_by_two_processes_gets_its_verdicts_in_order():
    """With two workers an implementation's properties are shared among children of its own (both cores busy on one
    plugin); its verdicts come back once each, in the technique's order, as with one worker."""
    from llm_inference_harness.engine.runner import Progress, check

    class Loads(Progress):
        count = 0

        def loaded(self, target, info):
            Loads.count += 1

    props = ["large_tables", "parallel_sampling_saves_70_percent", "shared_prompt_copy_on_write",
             "waste_per_request_is_half_a_block", "rejects_bad_input"]
    found = {}
    for jobs in (1, 2):
        Loads.count = 0
        [result] = check("block_manager", [Target("block_manager", name="simple")], profile="ci", properties=props,
                         jobs=jobs, progress=Loads())
        found[jobs] = [(v.property, v.status) for v in result.verdicts], Loads.count
    assert found[1] == ([(p, "pass") for p in props], 1)
    assert found[2] == (found[1][0], 4)  # four children, one part each
