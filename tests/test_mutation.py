"""Machine-made mutants (harness/engine/mutation.py): the pipeline on a few block-manager mutants, two quick
properties only (the full run is `harness mutants --machine-made DIR`, hours on 2 cores)."""

import importlib
import json
import sys

import pytest

from llm_inference_harness.engine import mutation as M
from llm_inference_harness.engine.inputs import UsageError

QUICK = ("rejects_bad_input", "large_tables")  # about a second a check
EVICT = "  # evict the least recently used cached block"


def mutant(subject: M.Subject, before: str, after: str) -> M.Mutation:
    """The mutation of ``subject`` that turns the line ``before`` into ``after`` (ids move when the file changes)."""
    lines = [i + 1 for i, text in enumerate((M.ROOT / subject.path).read_text().splitlines()) if text.strip() == before]
    for op, k, _ in [m for m in M.mutations_of(subject) if m[2] in lines]:
        m = M.Mutation(subject, op, k, subject.provides[0])
        changed = M.changed_line(subject.path, m.source())
        if (changed["before"], changed["after"]) == (before, after):
            return m
    raise LookupError(f"no mutation of {subject.path} turns {before!r} into {after!r}")


@pytest.fixture(scope="module")
def block_manager_subjects() -> dict[str, M.Subject]:
    return {s.path: s for s in M.subjects(["block_manager"])}


def test_the_sample_is_seeded_and_per_folder(block_manager_subjects):
    subjects = list(block_manager_subjects.values())
    first, again, other = M.sample(subjects, 3, seed=1), M.sample(subjects, 3, seed=1), M.sample(subjects, 3, seed=2)
    assert [m.id for m in first] == [m.id for m in again] != [m.id for m in other]
    assert sorted(m.subject.stratum for m in first) == ["docs/examples"] * 3 + ["impls/block_manager"] * 3
    assert {m.judged for m in first if m.subject.stratum == "docs/examples"} == {("block_manager", "BlockManager")}


def test_mutants_are_judged_as_plugins_and_a_run_resumes(block_manager_subjects, tmp_path):
    """An implementation's file (its registration collected from the mutated text) and an example plugin (checked as
    the README checks it): the originals pass, a swap_in that accepts a resident sequence is killed, an eviction of
    the most recently used block survives these two properties (the LRU property kills it)."""
    simple, example = block_manager_subjects["impls/block_manager/simple.py"], block_manager_subjects[
        "docs/examples/block_manager.py"]
    mutations = [mutant(simple, "if not seq.swapped:", "if not not seq.swapped:"),
                 mutant(example, 'if not seq["swapped"]:', 'if not not seq["swapped"]:'),
                 mutant(simple, f"b, h = self.evictable.popitem(last=False){EVICT}",
                        f"b, h = self.evictable.popitem(last=True){EVICT}")]
    records = M.judge(mutations, tmp_path, properties=QUICK, jobs=2, log=lambda line: None)
    outcomes = {(r["path"], r["operator"], r["after"]): r["outcome"] for r in records}
    assert sorted(outcomes.values()) == ["killed", "killed", "survived", "survived", "survived"], outcomes
    assert [o for (_, op, _), o in outcomes.items() if op == M.ORIGINAL] == ["survived", "survived"]
    summary = M.summarize(records, [])
    assert summary["techniques"]["block_manager"] == {"judged": 3, "killed": 2, "equivalent": 0, "survived": 1,
                                                      "score": round(2 / 3, 4)}

    def nothing_again(units):
        assert not units, f"judged again: {[u.key for u in units]}"
        return iter(())

    assert len(M.judge(mutations, tmp_path, properties=QUICK, executor=nothing_again, log=lambda line: None)) == 5


def test_triage_scores_and_weak_kills():
    """A triaged equivalent leaves the score's denominator; kills by a bad-input property alone, by a crash alone, or
    by one property are listed."""
    def record(op, after, verdicts):
        return {"id": f"f.py:{op}:0", "path": "f.py", "operator": op, "occurrence": 0, "line": 1, "before": "x",
                "after": after, "technique": "t", "impl": "i", "verdicts": verdicts,
                "outcome": M.outcome({"verdicts": verdicts})}

    fail = lambda prop, message="AssertionError: wrong": {"property": prop, "status": "FAIL", "message": message}
    ok = lambda prop: {"property": prop, "status": "pass", "message": ""}
    records = [record(M.ORIGINAL, "", [ok("law"), ok("rejects_bad_input")]),
               record("a", "y1", [fail("law"), fail("other_law")]),
               record("b", "y2", [ok("law"), fail("rejects_bad_input")]),
               record("c", "y3", [fail("law", "crashed: the checking process died"), ok("other_law")]),
               record("d", "y4", [fail("law"), ok("other_law")]),
               record("e", "y5", [ok("law"), ok("other_law")]),
               record("f", "y6", [ok("law"), ok("other_law")])]
    summary = M.summarize(records, [{"path": "f.py", "before": "x", "after": "y6", "verdict": "equivalent"}])
    assert summary["techniques"]["t"] == {"judged": 6, "killed": 4, "equivalent": 1, "survived": 1, "score": 0.8}
    weak = {kind: [m["operator"] for m in rows] for kind, rows in M.kill_quality(summary["mutants"].values()).items()}
    assert weak == {"bad input only": ["b"], "crash or hang only": ["c"], "one property": ["d"]}
    assert "| t | 6 | 4 | 1 | 1 | 80.0% |" in M.report(summary, title="t")


def test_a_mutant_that_registers_nothing_judged_is_incompetent():
    """A mutated text that no longer registers the implementation judged (its name changed) is no evidence either way,
    however the judge reports it: isolated, the plugin's load fails and every property fails with it."""
    lost = "LookupError: the mutated f.py registers no t implementation 'i' (it registers ['j'])"
    isolated = [{"property": "law", "status": "FAIL", "message": f"could not be loaded: {lost} (u0/plugin.py, line 3)"},
                {"property": "other_law", "status": "FAIL", "message": "not run: the plugin could not be loaded"}]
    in_process = [{"property": "law", "status": "FAIL", "message": f"error: the checking process failed: {lost}"}]
    crashed = [{"property": "law", "status": "FAIL", "message": "could not be loaded: ValueError: bad dtype"}]
    assert [M.outcome({"verdicts": v}) for v in (isolated, in_process, crashed)] == ["incompetent", "incompetent",
                                                                                      "killed"]


def test_a_plan_judged_for_one_technique_keeps_that_techniques_units(tmp_path):
    """--plan with a technique: a file that provides two techniques (torchao_affine.py) is judged only on the
    implementations of the technique asked for; its other units are left to that technique's run."""
    plan = tmp_path / "plan.json"
    plan.write_text('{"mutations": ["f.py:op:0@mine", "f.py:op:1@theirs", "g.py:op:0@other"]}')
    chosen = M.planned(plan, [M.Subject("f.py", (("t", "mine"),))])
    assert [(m.id, m.judged) for m in chosen] == [("f.py:op:0", ("t", "mine"))]


def test_an_implementation_is_attributed_to_the_file_that_registers_it(tmp_path, monkeypatch):
    """A file that registers an instance of a class of another file is the implementation's source (not its callable's
    ``__module__``), so the mutation tool mutates that file: impls/speculative/adaptive.py registers standard.py's
    SpeculativeSampling(unsure=0.4) as adaptive_gamma."""
    from llm_inference_harness.engine import registry

    files = {s.path: s.provides for s in M.subjects(["speculative"])}  # the real registry, loaded
    assert files["impls/speculative/adaptive.py"] == (("speculative", "adaptive_gamma"),)
    assert ("speculative", "adaptive_gamma") not in files["impls/speculative/standard.py"]

    (tmp_path / "sampler_class_elsewhere.py").write_text(
        "class Sampler:\n    def __call__(self, *args, **kwargs):\n        return []\n")
    (tmp_path / "registers_a_sampler.py").write_text(
        "from llm_inference_harness.engine.registry import register\n"
        "from sampler_class_elsewhere import Sampler\n\n"
        "register('speculative', 'elsewhere')(Sampler())\n"
        "register('speculative', 'declared', source='somewhere.else')(Sampler())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "REGISTRY", {})  # a registry of its own: the real one is left as it is
    try:
        importlib.import_module("registers_a_sampler")
    finally:
        for name in ("registers_a_sampler", "sampler_class_elsewhere"):
            sys.modules.pop(name, None)
    made = registry.REGISTRY
    assert made[("speculative", "elsewhere")].fn.__module__ == "sampler_class_elsewhere"
    assert made[("speculative", "elsewhere")].source == "registers_a_sampler"
    assert made[("speculative", "declared")].source == "somewhere.else"  # a helper names the file it registers for


def test_kills_are_confirmed_a_property_at_a_time_in_a_stronger_profile(block_manager_subjects, tmp_path):
    """`confirm` judges each earlier kill again: the property that covers most of a file's kills first, each on the
    unmutated file first; a mutant its earlier killers no longer kill, or whose killers the original now fails, is
    judged on every property; a second call judges nothing again."""
    simple = block_manager_subjects["impls/block_manager/simple.py"]
    a, b, c = (mutant(simple, "if not seq.swapped:", "if not not seq.swapped:"),
               mutant(simple, f"b, h = self.evictable.popitem(last=False){EVICT}",
                      f"b, h = self.evictable.popitem(last=True){EVICT}"),
               mutant(simple, "if seq.swapped:", "if not seq.swapped:"))
    everything = ("p1", "p2", "p3", "p4")

    def record(m, fails, props=everything):
        return {"key": f"{m.id}@simple", "id": m.id, "path": m.subject.path, "operator": m.operator,
                "occurrence": m.occurrence, "technique": "block_manager", "impl": "simple",
                **M.changed_line(m.subject.path, m.source()),
                "verdicts": [{"property": p, "status": "FAIL" if p in fails else "pass", "message": ""} for p in props]}

    original = M.Mutation(simple, M.ORIGINAL, 0, a.judged)
    prior = [record(original, {"p4"}), record(a, {"p1", "p2"}), record(b, {"p2"}), record(c, {"p1", "p4"})]
    fails = {original.id: {"p1"}, a.id: {"p2"}, b.id: {"p3"}, c.id: {"p2"}}  # in the stronger profile


    def executor(units):
        for u in units:

            mid = u.key.split("@")[0]
            props = u.properties or everything
            yield M.UnitResult(u.key, [{"property": p, "status": "FAIL" if p in fails[mid] else "pass",
                                        "message": ""} for p in props], 1.0, "here")

    records = M.confirm(prior, tmp_path, profile="ci", executor=executor, log=lambda line: None)
    name = {original.id: "original", a.id: "a", b.id: "b", c.id: "c"}
    order = [(name[k.split("@")[0]], k.split("#")[1]) for k in (r["key"] for r in records)]
    assert order == [("original", "p1+p2"), ("original", "all"), ("a", "p2"), ("b", "p2"), ("c", "all"), ("b", "all")]
    summary = M.summarize(records, [])
    assert {name[i]: sorted(m["killers"]) for i, m in summary["mutants"].items()} == {
        "a": ["p2"], "b": ["p3"], "c": ["p2"]}
    assert summary["techniques"]["block_manager"]["killed"] == 3

    def nothing_again(units):
        assert not units, f"judged again: {[u.key for u in units]}"
        return iter(())

    assert len(M.confirm(prior, tmp_path, profile="ci", executor=nothing_again, log=lambda line: None)) == 6
    results = tmp_path / "prior.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in prior))
    assert M.run_confirm(tmp_path, [results], profile="ci", executor=nothing_again, log=lambda line: None) == 0
    assert "| block_manager | 3 | 3 | 0 | 0 | 100.0% |" in (tmp_path / "report.md").read_text()
    moved = {**record(a, {"p2"}), "before": "if seq.swapped:"}  # recorded before its file changed
    with pytest.raises(UsageError, match="no longer changes `if seq.swapped:`"):
        M.confirm([record(original, set()), moved], tmp_path / "moved", profile="ci", executor=nothing_again)
