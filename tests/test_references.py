"""Laws of the float64 oracles themselves (harness/references/): the rounding term that large-logit bounds
add, and the identity the attention backward rests on.
"""

from hypothesis import example, given
from hypothesis import strategies as st

from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY
from llm_inference_harness.references.attention import attention64, attention_score_conditioning
from llm_inference_harness.references.attention_backward import attention_probs64
from llm_inference_harness.strategies.attention import AttentionCase, attention_cases
from llm_inference_harness.strategies.attention_backward import output_grad


@given(case=attention_cases(dtypes=("float16", "bfloat16", "float32"), max_len=40, magnitude=st.floats(1.0, 5e3)))
@example(case=AttentionCase(B=1, H=3, Hkv=3, Nq=1, Nk=1, d=8, causal=False, scale=None, dtype="bfloat16", seed=0,
                            magnitude=1000.0))  # found on an H200: e^(2 max|ds|) overflowed, 0 x inf gave a NaN bound
def test_score_conditioning_is_finite_and_within_the_values_spread(case):
    """The oracle's rounding term, which large-logit bounds add, is finite and no larger than the spread of the
    values (any softmax weights give a convex combination of them) plus what weights off by a small factor
    move (max |v|): 0 with one key, where e^(s - lse) is e^0 = 1 exactly."""
    q, k, v = case.tensors()
    bound = attention_score_conditioning(q, k, v, causal=case.causal, scale=case.scale)
    v64 = v.double()
    spread = (v64.amax(dim=2) - v64.amin(dim=2)).max().item()  # over all keys, per (batch, kv head, coordinate)
    top = v64.abs().max().item()  # the normalizers' part: weights off by a factor rho << 1 of the |v| they scale
    assert 0.0 <= bound <= spread + top, f"conditioning {bound} outside [0, spread of v + max |v| = {spread + top}]"
    if case.Nk == 1:
        assert bound == 0.0, f"conditioning {bound} with one key, where every formulation is exact"


# ---------------------------------------------------------------------------------------------
@given(case=attention_cases(max_len=64))
def test_delta_identity(case):
    """D_i = sum_j P_ij dP_ij = dO_i . O_i (float64): why the backward needs only O, never the row of P."""
    q, k, v = case.tensors()
    do = output_grad(case)
    (B, H, Nq, d), Hkv = q.shape, case.Hkv
    p = attention_probs64(q, k, causal=case.causal, scale=case.scale)  # (B, Hkv, G, Nq, Nk)
    dp = do.reshape(B, Hkv, H // Hkv, Nq, d) @ v[:, :, None].transpose(-1, -2)  # (B, Hkv, G, Nq, Nk)
    from_p = (p * dp).sum(-1).reshape(B, H, Nq)  # (B, H, Nq)
    from_o = (do * attention64(q, k, v, causal=case.causal, scale=case.scale)).sum(-1)  # (B, H, Nq)
    err = (from_p - from_o).abs().max().item()
    assert err <= FLOAT64_IDENTITY * max(1.0, from_o.abs().max().item()), f"D identity off by {err:.3g}"
