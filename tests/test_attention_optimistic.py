"""`fa2_optimistic`'s three tiers, each reached by the inputs it exists for and each exact, and its head groups.

The generic attention properties check the output; these check that the row-sum proofs pick the
tier they should: no shift for ordinary scores, the key-0 shift for a large common offset (where no
shift overflows), the running max when key 0 sits far below the rest (where both fixed shifts fail).
A tier that is never reached is a tier nobody tests.
"""

import math
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.engine.tolerance import assert_earned, dtype_of
from llm_inference_harness.impls.attention import fa2_optimistic
from llm_inference_harness.references.attention import attention64, attention_plain, attention_score_conditioning
from llm_inference_harness.strategies.attention import attention_cases

TIERS = {"no shift": 1, "key-0 shift": 2, "running max": 3}


def offset_scores(seed: int, offset: float, key0: float, N: int = 40, d: int = 16):
    """q, k, v (1, 2, N, d) float32 whose base-2 scores are N(0, 1) plus `offset`, and key 0's plus `key0`.

    Coordinate 0 carries the offsets: q's is fixed, k's is 1 for every key but key 0 (key0 / offset)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, N, d, generator=g) for _ in range(3))  # (B, H, N, d)
    to_nats = math.sqrt(d) / math.log2(math.e)  # base-2 score units -> q.k before the 1/sqrt(d) scale
    q[..., 0] = to_nats * offset
    k[..., 0] = 1.0
    k[..., 0, 0] = key0 / offset
    return q, k, v


def tier_taken(q, k, v, causal):
    """The output and the highest tier any query block needed."""
    taken = []
    fixed, running = fa2_optimistic.fixed_shift_block, fa2_optimistic.running_max_block

    def fixed_spy(qi, kT, vv, blocks, neg_m, *rest):
        taken.append(1 if neg_m is None else 2)
        return fixed(qi, kT, vv, blocks, neg_m, *rest)

    def running_spy(*args):
        taken.append(3)
        return running(*args)

    with mock.patch.object(fa2_optimistic, "fixed_shift_block", fixed_spy), \
            mock.patch.object(fa2_optimistic, "running_max_block", running_spy):
        out = fa2_optimistic.fa2_optimistic_attention(q, k, v, causal=causal, Br=16, Bc=16)
    return out, max(taken)


@pytest.mark.parametrize("tier", TIERS)
@given(seed=st.integers(0, 2**31 - 1), magnitude=st.floats(50.0, 120.0), causal=st.booleans())
def test_each_tier_is_reached_and_exact(tier, seed, magnitude, causal):
    offset, key0 = {"no shift": (1.0, 1.0), "key-0 shift": (magnitude, magnitude),
                    "running max": (magnitude, -magnitude)}[tier]
    q, k, v = offset_scores(seed, offset, key0)
    out, taken = tier_taken(q, k, v, causal)
    assert taken == TIERS[tier], f"{tier} inputs took tier {taken}; reproduce with seed={seed}, magnitude={magnitude}"
    truth, plain = attention64(q, k, v, causal=causal), attention_plain(q, k, v, causal=causal)
    conditioning = attention_score_conditioning(q, k, v, causal=causal)
    assert_earned(out, truth, plain, torch.float32, what=f"fa2_optimistic, {tier} tier (seed={seed})",
                  kind="large_logits", conditioning=conditioning)


@given(case=attention_cases(dtypes=("float64", "float32"), max_len=80), heads_per_pass=st.integers(1, 3),
       tile=st.sampled_from([(16, 16), (17, 33), (32, 8)]), exp2=st.booleans())
def test_head_groups_see_only_their_heads(case, heads_per_pass, tile, exp2):
    """A score budget of 1-3 kv heads per pass (one CPU thread's holds two at 256 x 512) gives the reference's
    output: each group's slices of q, k, v, out and the work buffers are its own, the last, shorter group too.
    The registered tiles split only the largest cases the other properties draw.  Both bases of the exp are
    drawn: the other properties see only the one this machine runs faster."""
    q, k, v = case.tensors()
    Br, Bc = tile
    budget = heads_per_pass * min(Br, case.Nq) * (case.H // case.Hkv) * min(Bc, case.Nk)
    out = fa2_optimistic.fa2_optimistic_attention(q, k, v, causal=case.causal, scale=case.scale, Br=Br, Bc=Bc,
                                                  score_floats=budget, exp2=exp2)
    truth = attention64(q, k, v, causal=case.causal, scale=case.scale)
    plain = attention_plain(q, k, v, causal=case.causal, scale=case.scale)
    assert_earned(out, truth, plain, dtype_of(case.dtype),
                  what=f"fa2_optimistic, {heads_per_pass} kv heads per pass of {case.B * case.Hkv}, exp2={exp2}")
