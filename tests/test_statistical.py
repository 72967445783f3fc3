"""The goodness-of-fit test (harness/sampling/statistical.py): its sample size, the least that reaches the
stated power.
"""

from llm_inference_harness.sampling.statistical import ALPHA, DELTA, POWER, goodness_of_fit, sample_size


def test_sample_size_is_the_least_with_the_stated_power():
    from llm_inference_harness.sampling.statistical import power

    n = sample_size(9)
    assert power(n, 9) >= POWER > power(n - 1, 9)
    assert ALPHA == 0.001 and DELTA == 0.05


def test_an_impossible_output_rejects_without_breaking_the_test():
    """A sampled output of probability 0 is a rejection on its own (found by a sort that lost the tie rule, which
    first made scipy's chisquare raise: observed counts over fewer outputs than were drawn)."""
    fit = goodness_of_fit([0] * 60 + [1] * 30 + [2] * 10, {0: 0.6, 1: 0.4})
    assert fit.rejected and fit.impossible == {2: 10}
    assert "impossible outputs {2: 10}" in fit.describe()
