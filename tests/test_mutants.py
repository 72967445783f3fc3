"""Every registered mutant must be killed, and by the property its bug declares -- by what it computes:
a mutant that crashes (the declared killer fails with "raised ...") models no bug the property finds.

Runs the same property functions the CLI runs, through llm_inference_harness.engine.runner, so `pytest` and
`harness mutants` agree.
"""

import pytest

from llm_inference_harness.contracts import load_techniques
from llm_inference_harness.engine.registry import impls
from llm_inference_harness.engine.runner import kill_mutant, properties_of

MUTANTS = [m for t in sorted(load_techniques()) for m in impls(t, mutants=True)]


@pytest.mark.parametrize("mutant", MUTANTS, ids=[f"{m.technique}:{m.name}" for m in MUTANTS])
def test_mutant_is_killed_for_the_right_reason(mutant):
    if mutant.unavailable:  # a mutant of a library's adapter needs that library (the `external` extra)
        pytest.skip(f"{mutant.name}: {mutant.unavailable}")
    assert mutant.killed_by, f"mutant {mutant.name} declares no killed_by property"
    props = properties_of(mutant.technique)
    unknown = set(mutant.killed_by) - {p.name for p in props}
    assert not unknown, f"mutant {mutant.name} names unknown properties {sorted(unknown)}"
    verdicts = kill_mutant(mutant, props, profile="(pytest)", all_properties=False)
    killers = [v.property for v in verdicts if v.status == "FAIL"]
    assert set(killers) & set(mutant.killed_by), (
        f"mutant {mutant.name} ({mutant.bug}) survived its declared killers {mutant.killed_by}; "
        f"killed by: {killers or 'nothing'}")
    crashes = [v for v in verdicts if v.status == "FAIL" and v.property in mutant.killed_by
               and "ContractViolation: raised " in v.message]
    assert len(crashes) < len(set(killers) & set(mutant.killed_by)), (
        f"mutant {mutant.name} crashed instead of computing its bug: {crashes[0].message}")
    last = verdicts[-1]  # the pass stops at the first kill for its reason: nothing runs after it
    assert last.status == "FAIL" and last.property in mutant.killed_by and last not in crashes, (
        f"mutant {mutant.name}: the run went on past its kill to {last.property}")
