"""The Triton FlashAttention-2 forward (impls/attention/triton_fa2.py) at sizes its runner affords.

Natively ("triton_fa2", CUDA) and under Triton's CPU interpreter ("triton_fa2_interpret", registered only
when TRITON_INTERPRET=1, e.g. ``TRITON_INTERPRET=1 pytest properties/test_triton_attention.py``), the
kernel's o and L must equal the float64 reference within the earned forward tolerance.  Lengths stay
within the implementation's declared ``max_len`` (the interpreter runs every program in Python).
conftest.py sets TRITON_INTERPRET=1 on machines without CUDA, so wherever Triton is installed (the
[test] extra) the kernel is tested, natively or interpreted.
"""

import torch
from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.engine.capabilities import needs_cap
from llm_inference_harness.engine.devices import available
from llm_inference_harness.engine.guard import call_limit, guarded_call
from llm_inference_harness.engine.tolerance import assert_earned, dtype_of
from llm_inference_harness.references.attention import (
    attention_lse64,
    attention_lse_plain,
    attention_plain,
    large_logit_yardstick,
)
from llm_inference_harness.strategies.attention import attention_cases

TECHNIQUE = "attention"


@needs_cap("triton", "a Triton kernel")
@given(data=st.data())
def test_triton_output_and_lse_match_reference(impl, data):
    case = data.draw(attention_cases(dtypes=impl.dtypes, devices=available(impl.devices),
                                     max_len=impl.caps.max_len or 300), label="case")
    q, k, v = case.tensors()
    o, lse = guarded_call(impl.fn, q, k, v, causal=case.causal, scale=case.scale, return_lse=True,
                          arg_names=("q", "k", "v"), timeout_s=call_limit(impl))
    truth_o, truth_lse = attention_lse64(q, k, v, causal=case.causal, scale=case.scale)
    assert_earned(o, truth_o, attention_plain(q, k, v, causal=case.causal, scale=case.scale),
                  dtype_of(case.dtype), what=f"{impl.name} o vs float64 reference")
    blind = truth_lse.isinf()
    assert torch.equal(lse.isinf() & (lse < 0), blind), f"{impl.name}: L = -inf exactly on rows that see no key"
    plain = [p.masked_fill(blind, 0) for p in attention_lse_plain(q, k, v, causal=case.causal, scale=case.scale)]
    assert_earned(lse.masked_fill(blind, 0), truth_lse.masked_fill(blind, 0), plain, dtype_of(case.dtype),
                  what=f"{impl.name} L vs float64 logsumexp")


@needs_cap("triton", "a Triton kernel")
@given(data=st.data())
def test_triton_large_logits(impl, data):
    """Scores of 1e3-1e4 must not overflow: the running max is subtracted before exp.  In every declared dtype,
    like test_attention's large-logit property: the bound of a half-precision kernel is earned by a plain
    computation with float32 scores (in the inputs' own precision q.k overflows float16)."""
    case = data.draw(attention_cases(dtypes=impl.dtypes, devices=available(impl.devices),
                                     max_len=impl.caps.max_len or 130, magnitude=st.floats(1e3, 1e4)), label="case")
    q, k, v = case.tensors()
    o = guarded_call(impl.fn, q, k, v, causal=case.causal, scale=case.scale, arg_names=("q", "k", "v"),
                     timeout_s=call_limit(impl))
    truth_o, _ = attention_lse64(q, k, v, causal=case.causal, scale=case.scale)
    plain, conditioning = large_logit_yardstick(q, k, v, causal=case.causal, scale=case.scale)
    assert_earned(o, truth_o, plain, dtype_of(case.dtype), what=f"{impl.name} at logits ~{case.magnitude:.0f}",
                  kind="large_logits", conditioning=conditioning)
