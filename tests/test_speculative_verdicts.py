"""Correct samplers at the edges of the speculative contract get the verdict its text predicts
(harness/contracts/speculative.py): a plain list has no round records (declared: rounds=False), a round ends
where the next target call says whatever its last draw, and the bonus and budget rules are named where they are
broken (drafting past max_new_tokens fails at once, where it used to run into the tiny models' deadline after
minutes).

The samplers are tests/speculative_samplers.py; each is run through the properties the contract's clause
decides (`llm_inference_harness.engine.runner`, as `harness check --no-shrink` runs them: the clause decides the
verdict, whatever the example), the other properties being the standard sampler's.
"""

import pytest

from llm_inference_harness.engine.registry import make_impl
from llm_inference_harness.engine.runner import properties_of, run_property
from tests import speculative_samplers

BONUS_RULE = "the contract's bonus rule"
BUDGET_RULE = "the contract's budget rule"
DECLARED = {"list_sampler": {"rounds": False}, "undeclared_list_sampler": {}}  # sampler -> its caps
EXPECTED = {  # sampler -> {property: (status, what its message must say)}
    "list_sampler": {"round_records_add_up": ("skip", "plain list of tokens"),
                     "matches_target_distribution": ("pass", "")},
    "undeclared_list_sampler": {"round_records_add_up": ("FAIL", "declare caps={'rounds': False}"),
                                "matches_target_distribution": ("pass", "")},
    "coin_residual": {"tokens_per_call_matches_formula": ("pass", ""),
                      "draft_equal_to_target_accepts_everything": ("pass", ""),
                      "matches_target_distribution": ("pass", ""),
                      "matches_target_distribution_on_tiny_models": ("pass", "")},
    "coin_residual_spare_draw": {"tokens_per_call_matches_formula": ("pass", ""),
                                 "draft_equal_to_target_accepts_everything": ("pass", "")},
    "kept_drafts": {"tokens_per_call_matches_formula": ("pass", ""), "round_records_add_up": ("pass", ""),
                    "matches_target_distribution": ("pass", "")},
    "exact_no_bonus": {"tokens_per_call_matches_formula": ("FAIL", BONUS_RULE),
                       "draft_equal_to_target_accepts_everything": ("FAIL", BONUS_RULE),
                       "round_records_add_up": ("FAIL", "bonus rule"),
                       "matches_target_distribution": ("pass", "")},
    "past_budget": {"matches_target_distribution": ("FAIL", BUDGET_RULE),
                    "matches_target_distribution_on_tiny_models": ("FAIL", BUDGET_RULE),
                    "round_records_add_up": ("pass", "")},
}


@pytest.mark.parametrize(("sampler", "prop"), [(s, p) for s, props in EXPECTED.items() for p in props])
def test_verdict_is_the_contracts(sampler, prop):
    fn = getattr(speculative_samplers, sampler.removeprefix("undeclared_"))
    impl = make_impl("speculative", sampler, fn, caps=DECLARED.get(sampler, {}))
    status, says = EXPECTED[sampler][prop]
    (chosen,) = [p for p in properties_of("speculative") if p.name == prop]
    verdict = run_property(chosen, impl, profile="(pytest)", shrink=False)  # the verdict, not a minimal example
    assert (verdict.status, says in verdict.message) == (status, True), (
        f"{sampler} / {prop}: {verdict.status} '{verdict.message}', the contract predicts {status} '{says}'")
