"""Speculative decoding on processed distributions (contract: harness/contracts/speculative.py, "Processed
distributions"; the processing is harness/contracts/sampling.py's).

A request samples with temperature, top-k, top-p and min-p; its target's rows are processed with them, and its
draft proposes from rows processed with the draft's own parameters.  The exact distribution of the first T tokens,
every branch of the sampler's draws visited (harness/sampling/enumeration.py), must equal the processed target's
autoregressive distribution, whatever the draft's parameters: given the processed models as models, or, for a
sampler declaring ``processes``, given the raw models and both rows of parameters to apply itself.  A sampler that
processes one side only, or judges its drafts with a q processed otherwise than the one it drew them from, fails.
"""

import functools

from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.engine.capabilities import applies
from llm_inference_harness.engine.guard import ContractViolation, guarded_call
from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY
from llm_inference_harness.references.sampling import ProcessedLM
from llm_inference_harness.references.speculative import autoregressive_distribution
from llm_inference_harness.sampling.enumeration import (
    DraftsPastBudget,
    EnumerationTooSlow,
    exact_distribution,
    max_difference,
)
from llm_inference_harness.strategies.sampling import processing_params
from llm_inference_harness.strategies.speculative import speculative_cases

TECHNIQUE = "speculative"
ENUMERATION_LIMIT_S = 60.0  # per enumerated case: a sampler that loops forever gets a verdict, not a hang


@applies(lambda impl: "draws its own randomness (caps rng='own'): not enumerable" if impl.caps.rng == "own" else None)
@applies(lambda impl: "greedy: deterministic" if impl.caps.greedy else None)
@given(data=st.data())
def test_matches_processed_target_distribution(impl, data):
    """The enumerated distribution of the first T tokens is the processed target's, for any draft parameters."""
    case = data.draw(speculative_cases(max_gamma=3, max_T=3, max_V=5, width=impl.caps.draft_width), label="case")
    target_params, draft_params = data.draw(processing_params(), label="target"), data.draw(processing_params(),
                                                                                              label="draft")
    target, draft = case.models()
    truth_model = ProcessedLM(target, target_params)
    if impl.caps.processes:
        sampler = functools.partial(impl.fn, target_params=target_params, draft_params=draft_params)
    else:
        sampler, target, draft = impl.fn, truth_model, ProcessedLM(draft, draft_params)
    truth = autoregressive_distribution(truth_model, case.prompt, case.T, case.eos)
    try:
        got = guarded_call(exact_distribution, sampler, target, draft if impl.caps.draft else None, list(case.prompt),
                           gamma=case.gamma, T=case.T, eos=case.eos, merge=impl.caps.markov,
                           deadline_s=0.9 * ENUMERATION_LIMIT_S, timeout_s=ENUMERATION_LIMIT_S, hang_owner=impl.fn)
    except ContractViolation as exc:
        if isinstance(exc.__cause__, EnumerationTooSlow | DraftsPastBudget):
            raise exc.__cause__ from None
        raise
    impossible = {k: v for k, v in got.dist.items() if v > 0 and k not in truth}
    assert not impossible, f"{impl.name}: outputs the processed target never generates: {impossible}"
    err, where = max_difference(got.dist, truth)
    assert err <= FLOAT64_IDENTITY, (
        f"{impl.name} (gamma={case.gamma}, T={case.T}, target {target_params}, draft {draft_params}): P{where} = "
        f"{got.dist.get(where, 0.0)!r} but the processed target gives {truth.get(where, 0.0)!r} (off by {err:.3g})")
