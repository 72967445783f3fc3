"""The expected-gain calculator of speculative decoding (harness/sampling/speedup.py): the closed forms of
Leviathan et al. 2023 (Sec. 3.3-3.4) and their worked examples.
"""

from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY
from llm_inference_harness.sampling.speedup import best_gamma, speedup, tokens_per_call


# ---------------------------------------------------------------------------------------------
# Leviathan et al. 2023's closed forms (Eq. 1, Theorem 3.8) at points computed by hand: alpha = 0.8, gamma = 4 gives
# (1 - 0.8^5) / 0.2 = 3.36 tokens a call, and at c = 0.1 a speedup of 3.36 / 1.4 = 2.40
def test_speedup_calculator_reproduces_worked_exercises():
    assert round(tokens_per_call(0.8, 4), 2) == 3.36
    assert round(speedup(0.8, 4, 0.1), 2) == 2.40
    assert [round(speedup(0.8, g, 0.05), 2) for g in (1, 4, 8, 10)] == [1.71, 2.80, 3.09, 3.05]
    assert best_gamma(0.8, 0.05)[0] == 8
    g, s = best_gamma(0.6, 0.05)
    assert (g, round(s, 2)) == (4, 1.92)
    # a verify call costing 1.6 single steps (this CPU at gamma = 6) instead of Theorem 3.8's 1: 2.40x -> 1.68x
    assert round(speedup(0.8, 4, 0.1, verify=1.6), 2) == 1.68


@given(a=st.floats(0.0, 0.999), gamma=st.integers(1, 16))
def test_tokens_per_call_is_the_closed_form(a, gamma):
    closed = (1 - a ** (gamma + 1)) / (1 - a)
    assert abs(tokens_per_call(a, gamma) - closed) <= FLOAT64_IDENTITY * closed * gamma
