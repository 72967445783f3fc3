"""The goodness-of-fit test's sample size (harness/sampling/statistical.py): the least that reaches the
stated power.
"""

from llm_inference_harness.sampling.statistical import ALPHA, DELTA, POWER, sample_size


def test_sample_size_is_the_least_with_the_stated_power():
    from llm_inference_harness.sampling.statistical import power

    n = sample_size(9)
    assert power(n, 9) >= POWER > power(n - 1, 9)
    assert ALPHA == 0.001 and DELTA == 0.05
