"""harness.compare's statistics on synthetic rounds, and its worker's protocol on this checkout.

The detection and false-alarm rates on this machine are measured by a benchmark (bench_harness.ComparisonPower,
`python -m harness.compare --power`), not here: tests check, benchmarks measure."""

import math
import sys

import numpy as np
import pytest
from scipy.stats import wilcoxon

from harness import compare
from harness.compare import Result, judge, signed_rank_interval


def rounds(ratio: float, noise: float, n: int = 30, load: float = 0.0, seed: int = 0) -> Result:
    """Paired rounds whose B / A is ``ratio`` times log-normal noise; ``load`` scales both sides of a round
    alike (a neighbour's burst), as alternating rounds on a shared machine see it."""
    g = np.random.default_rng(seed)
    shared = np.exp(load * g.standard_normal(n))
    a = 0.01 * shared * np.exp(noise * g.standard_normal(n))
    b = 0.01 * ratio * shared * np.exp(noise * g.standard_normal(n))
    return Result("bench_x.C.time_f", (), a=list(a), b=list(b))


def test_interval_ends_where_the_signed_rank_test_starts_rejecting():
    d = np.random.default_rng(1).standard_normal(12)
    centre, low, high = signed_rank_interval(d, 0.99)
    assert low < centre < high
    for end, outside in ((low, -1e-9), (high, 1e-9)):
        assert wilcoxon(d - (end + outside), method="exact").pvalue <= 0.01
        assert wilcoxon(d - (end - outside), method="exact").pvalue > 0.01


def test_interval_covers_the_true_shift_as_often_as_its_confidence_says():
    g = np.random.default_rng(2)
    covered = 0
    for _ in range(400):
        d = 0.3 + g.laplace(0, 0.05, 20)  # heavy tails: a load spike in one round
        _, low, high = signed_rank_interval(d, 0.99)
        covered += low <= 0.3 <= high
    assert covered / 400 >= 0.97


def test_too_few_rounds_give_an_unbounded_interval():
    _, low, high = signed_rank_interval([0.1, 0.2, 0.3, 0.1, 0.2], 0.99)  # 2 / 2^5 > 1%: nothing excluded
    assert math.isinf(low) and math.isinf(high)


@pytest.mark.parametrize(("ratio", "verdict"), [(1.10, "slower"), (1 / 1.10, "faster"), (1.0, "same"),
                                                (1.02, "same")])
def test_verdicts(ratio, verdict):
    r = judge(rounds(ratio, noise=0.01))
    assert r.verdict == verdict, (r.ratio, r.low, r.high)
    assert r.low <= ratio <= r.high


def test_a_significant_change_below_min_effect_is_same():
    r = judge(rounds(1 + compare.MIN_EFFECT / 2, noise=0.002))  # interval far from 1, change too small to call
    assert r.low > 1 and r.verdict == "same"


def test_load_on_both_sides_of_a_round_cancels():
    r = judge(rounds(1.10, noise=0.01, load=0.5))  # each round's load moves both sides by ~50%
    assert r.verdict == "slower" and r.high / r.low < 1.03


def test_wide_interval_is_noisy_not_same():
    r = judge(rounds(1.0, noise=0.4, n=12))
    assert r.verdict == "noisy"


def test_track_verdicts_follow_the_unit():
    up = rounds(1.10, noise=0.01)
    up.kind = "track"
    assert judge(up, higher_is_better=True).verdict == "better"
    assert judge(up, higher_is_better=False).verdict == "worse"
    assert judge(up, higher_is_better=None).verdict == "higher"


def test_worker_lists_sets_up_samples_and_skips(tmp_path):
    with compare.Worker(sys.executable, compare.ROOT) as w:
        cases = w.cases(r"^bench_harness\.Calibrated|^bench_attention\.KernelTflops.*'cuda', 1024, 64, True\)")
        assert ("bench_harness.Calibrated.time_work", ()) in cases
        assert w.ask("setup", name="bench_harness.Calibrated.time_work", params=[])["ok"]
        sample = w.ask("sample")
        assert sample["value"] > 0 and sample["cpu"] > 0
        w.ask("teardown")
        cuda = next(c for c in cases if c[0].startswith("bench_attention.KernelTflops"))
        answer = w.ask("setup", name=cuda[0], params=list(cuda[1]))
        assert "skip" in answer or answer.get("ok")  # skipped without a GPU, set up with one
