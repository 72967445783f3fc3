"""Correct formulations the earned bounds must admit: normalizing by a logsumexp, merging partitions by e^(lse_p - lse).

tests/attention_formulations.py implements them.  Each pinned case below was a false alarm of the large-logit
yardstick before it admitted these formulations (the error it measured is quoted); the properties that draw
extreme logits in every dtype must pass them too.
"""

import functools

import pytest
import torch

from llm_inference_harness.engine.registry import make_impl
from llm_inference_harness.engine.runner import properties_of, run_property
from llm_inference_harness.engine.tolerance import assert_earned, dtype_of
from llm_inference_harness.references.attention import attention64, large_logit_yardstick
from llm_inference_harness.strategies.attention import AttentionCase
from llm_inference_harness.strategies.paged_attention import PagedAttentionCase
from tests import attention_formulations as formulations

FORMULATIONS = {
    "attention": {"lse_normalized": formulations.lse_normalized, "lse_merged_splitk": formulations.lse_merged_splitk},
    "paged_attention": {"lse_merged_paged": functools.partial(formulations.lse_merged_paged, partition=32)},
    "attention_backward": {"exp2_backward": formulations.exp2_backward},
}
# (case, the error the formulation made, the bound it was held to before)
ATTENTION_FALSE_ALARMS = [
    # one key dominates by e^-32: L = m + log(1 + 8.5e-15) rounds to m, so every weight is 1 + 8.5e-15 too large
    (AttentionCase(B=1, H=1, Hkv=1, Nq=15, Nk=15, d=8, causal=False, scale=None, dtype="float64", seed=1,
                   magnitude=1000.0), 2.09e-14, 8.93e-15),
    # L of ~1e3 in float32: m + log l rounded by up to 6e-5 of a nat
    (AttentionCase(B=1, H=1, Hkv=1, Nq=16, Nk=16, d=1, causal=False, scale=None, dtype="float32", seed=1,
                   magnitude=1000.0), 3.43e-05, 9.78e-06),
]
PAGED_FALSE_ALARMS = [
    (PagedAttentionCase(B=1, H=3, Hkv=1, Nq=1, seq_lens=(128,), d=1, block_size=1, spare_blocks=0, causal=False,
                        scale=None, dtype="float64", seed=0, magnitude=1000.0, table_slack=0), 3.84e-14, 5.45e-15),
    (PagedAttentionCase(B=2, H=4, Hkv=4, Nq=1, seq_lens=(1, 23), d=1, block_size=16, spare_blocks=0, causal=False,
                        scale=None, dtype="float32", seed=1_073_741_823, magnitude=1000.0, table_slack=0,
                        shared_blocks=1), 5.36e-06, 3.48e-06),
]


def still_past(err: float, old_bound: float, out, truth) -> None:
    """The case still shows the formulation's error above the bound it used to be held to: a real false alarm."""
    got = (out.double() - truth).abs().max().item()
    assert got > old_bound, f"error {got:.3g} (was {err:.3g}) is no longer past the old bound {old_bound:.3g}"


@pytest.mark.parametrize("name", sorted(FORMULATIONS["attention"]))
@pytest.mark.parametrize("case,err,old_bound", ATTENTION_FALSE_ALARMS, ids=["float64", "float32"])
def test_attention_false_alarms_are_admitted(name, case, err, old_bound):
    q, k, v = case.tensors()
    out = FORMULATIONS["attention"][name](q, k, v, causal=case.causal, scale=case.scale)
    truth = attention64(q, k, v, causal=case.causal, scale=case.scale)
    still_past(err, old_bound, out, truth)
    plain, conditioning = large_logit_yardstick(q, k, v, causal=case.causal, scale=case.scale)
    assert_earned(out, truth, plain, dtype_of(case.dtype), what=f"{name} at logits ~{case.magnitude:.0f}",
                  kind="large_logits", conditioning=conditioning)


@pytest.mark.parametrize("case,err,old_bound", PAGED_FALSE_ALARMS, ids=["float64", "float32"])
def test_paged_false_alarms_are_admitted(case, err, old_bound):
    out = FORMULATIONS["paged_attention"]["lse_merged_paged"](*case.paged(), causal=case.causal, scale=case.scale)
    q, kv = case.contiguous()
    truths = [attention64(q[b:b + 1], k, v, causal=case.causal, scale=case.scale) for b, (k, v) in enumerate(kv)]
    still_past(err, old_bound, out, torch.cat(truths))
    for b, (k, v) in enumerate(kv):
        plain, conditioning = large_logit_yardstick(q[b:b + 1], k, v, causal=case.causal, scale=case.scale)
        assert_earned(out[b:b + 1], attention64(q[b:b + 1], k, v, causal=case.causal, scale=case.scale), plain,
                      dtype_of(case.dtype), what=f"lse_merged_paged sequence {b}", kind="large_logits",
                      conditioning=conditioning)


EXTREME = ("large_logits_stay_finite_and_correct", "logits_far_below_zero", "scores_1000_999_998_10")


@pytest.mark.parametrize("technique,name", [(t, n) for t, names in FORMULATIONS.items() for n in names])
def test_formulations_pass_the_extreme_logit_properties(technique, name):
    """Every property that draws extreme logits (in every dtype: float64, float32, bfloat16, float16), run against
    the formulation as against any implementation."""
    impl = make_impl(technique, name, FORMULATIONS[technique][name])
    props = [p for p in properties_of(technique) if p.name in EXTREME]
    assert props, f"no extreme-logit property of {technique}"
    for prop in props:
        verdict = run_property(prop, impl, profile="(pytest)")
        assert verdict.status == "pass", f"{name} {prop.name}: {verdict.message}\n{verdict.counterexample}"
