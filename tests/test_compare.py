"""llm_inference_harness.bench.compare's statistics on synthetic rounds, and its worker's protocol on this checkout.

The detection and false-alarm rates on this machine are measured by a benchmark (bench_harness.ComparisonPower,
`python -m llm_inference_harness.bench.compare --power`), not here: tests check, benchmarks measure."""

import math
import sys

import numpy as np
import pytest
from scipy.stats import wilcoxon

from llm_inference_harness.bench import compare
from llm_inference_harness.bench.compare import Result, judge, signed_rank_interval


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


def paired(ratio: float, pair_sd: float, noise: float, pairs: int = 10, per_pair: int = 4, seed: int = 0) -> Result:
    """Rounds in ``pairs`` worker pairs whose B side carries an offset of its own for all its rounds (a process's
    memory layout), log-normal with ``pair_sd``, on top of each round's noise."""
    g = np.random.default_rng(seed)
    offset = np.repeat(np.exp(pair_sd * g.standard_normal(pairs)), per_pair)
    n = pairs * per_pair
    a = 0.01 * np.exp(noise * g.standard_normal(n))
    b = 0.01 * ratio * offset * np.exp(noise * g.standard_normal(n))
    return Result("bench_x.C.time_f", (), a=list(a), b=list(b), pairs=list(np.repeat(np.arange(pairs), per_pair)))


def test_an_offset_per_worker_pair_is_no_false_alarm_when_pairs_are_the_unit():
    """One pair's rounds share its offset: all the rounds in one pair (the design before) call identical code
    slower or faster in a quarter of comparisons; the rounds over PAIRS pairs, judged by pair, in at most 1%
    (pair offsets of 3% and round noise of 3%, the upper end of what was measured here: docs/benchmarks.md)."""
    per_pair = compare.ROUNDS // compare.PAIRS
    one_pair = sum(judge(paired(1.0, pair_sd=0.03, noise=0.03, pairs=1, per_pair=per_pair * compare.PAIRS,
                                seed=seed)).verdict in ("slower", "faster") for seed in range(40))
    by_pair = sum(judge(paired(1.0, pair_sd=0.03, noise=0.03, pairs=compare.PAIRS, per_pair=per_pair,
                               seed=seed)).verdict in ("slower", "faster") for seed in range(400))
    assert by_pair <= 4 and one_pair >= 10, (by_pair, one_pair)


def test_five_percent_is_seen_through_pair_offsets():
    per_pair = compare.ROUNDS // compare.PAIRS
    seen = sum(judge(paired(1.05, pair_sd=0.03, noise=0.03, pairs=compare.PAIRS, per_pair=per_pair,
                            seed=seed)).verdict == "slower" for seed in range(200))
    assert seen >= 190


class FakeWorker:
    """A benchworker's answers without a process: samples of ``value`` seconds, an error at sample ``fail_at``."""

    def __init__(self, value: float, fail_at: int | None = None) -> None:
        self.value, self.fail_at, self.samples, self.numbers = value, fail_at, 0, []

    def ask(self, op: str, **request) -> dict:
        if op == "setup":
            self.numbers.append(request.get("number"))
            return {"ok": True, "number": request.get("number") or 7, "unit": "seconds"}
        if op == "sample":
            self.samples += 1
            return {"error": "boom"} if self.samples == self.fail_at else {"cpu": self.value, "value": self.value}
        return {"ok": True}


def test_rounds_spread_over_pairs_and_the_first_pair_fixes_the_calls():
    run = compare.Rounds(("bench_x.C.time_f", ()), ("bench_x.C.time_f", ()), rounds=12, pairs=3)
    for p in range(3):
        a, b = FakeWorker(0.010), FakeWorker(0.011)
        run.pair(a, b, p)
        assert b.numbers == [7] and a.numbers == [None if p == 0 else 7]
    r = run.result()
    assert r.pairs == [0] * 4 + [1] * 4 + [2] * 4 and len(r.a) == len(r.b) == 12
    assert r.ratio == pytest.approx(1.1)


def test_a_round_cut_short_by_an_error_is_dropped_whole():
    run = compare.Rounds(("bench_x.C.time_f", ()), ("bench_x.C.time_f", ()), rounds=8, pairs=2)
    run.pair(FakeWorker(0.01), FakeWorker(0.01, fail_at=3), 0)
    r = run.result()
    assert r.verdict == "error" and r.why == "boom" and len(r.a) == len(r.b) == len(r.pairs) == 2


@pytest.mark.parametrize("ratio, pair_sd, is_settled", [
    (1.0, 0.005, True),  # its interval lies within 2.5% of 1
    (1.05, 0.005, True), (1 / 1.05, 0.005, True),  # beyond it, above or below
    (1.025, 0.005, False),  # across the floor's edge
    (1.0, 0.03, False), (1.05, 0.03, False),  # too wide yet
])
def test_a_case_settles_when_its_interval_lies_within_or_beyond_the_floor(ratio, pair_sd, is_settled):
    assert compare.settled(paired(ratio, pair_sd=pair_sd, noise=0.01, pairs=8, per_pair=10, seed=1)) == is_settled


class NoisyWorker(FakeWorker):
    """Samples of ``value`` seconds (this process's layout) times per-sample log-normal ``noise``."""

    def __init__(self, value: float, noise: float, g) -> None:
        super().__init__(value)
        self.noise, self.g = noise, g

    def ask(self, op: str, **request) -> dict:
        if op == "sample":
            v = self.value * math.exp(self.noise * self.g.standard_normal())
            return {"cpu": v, "value": v}
        return super().ask(op, **request)

    def close(self) -> None:
        pass


class ShiftedWorkers:
    """Starts workers of ``base`` seconds, each with a layout offset of its own (log-normal ``pair_sd``)."""

    def __init__(self, base: float, pair_sd: float, noise: float, seed: int) -> None:
        self.base, self.pair_sd, self.noise, self.g, self.started = base, pair_sd, noise, np.random.default_rng(seed), 0

    def __call__(self) -> NoisyWorker:
        self.started += 1
        return NoisyWorker(self.base * math.exp(self.pair_sd * self.g.standard_normal()), self.noise, self.g)


@pytest.mark.parametrize("ratio, pairs_measured, verdict", [
    (1.0, 8, "same"), (1.05, 8, "slower"), (1 / 1.05, 8, "faster"), (1.025, compare.PAIRS, "same")])
def test_a_comparison_stops_early_only_when_every_case_is_settled(ratio, pairs_measured, verdict):
    """Code that changed nothing, or changed by 5%, measured quietly, stops after FIRST_LOOK pairs; a change at the
    floor's edge, whose interval straddles it, is measured on every pair (and its estimate, here 1.0245, just
    misses the floor)."""
    start_a, start_b = ShiftedWorkers(0.01, 0.003, 0.005, seed=0), ShiftedWorkers(0.01 * ratio, 0.003, 0.005, seed=1)
    case = ("bench_x.C.time_f", ())
    (r,) = compare.measure(start_a, start_b, [(case, case)], progress=lambda _: None)
    assert len(set(r.pairs)) == pairs_measured and r.verdict == verdict
    assert start_a.started == min(pairs_measured + 1, compare.PAIRS)  # the next pair was started while one measured


def test_stopping_when_settled_keeps_the_verdicts_at_five_percent():
    """The design with looks from FIRST_LOOK pairs on calls +5% slower exactly when the one that always measures
    every pair does, on the same synthetic comparisons (pair offsets 2%, round noise 3%)."""
    from llm_inference_harness.bench.design import judged, synthetic

    g = np.random.default_rng(0)
    for _ in range(60):
        r = synthetic(0.05, compare.PAIRS, compare.ROUNDS, 0.02, 0.03, g)
        assert judged(r, compare.MIN_EFFECT, compare.FIRST_LOOK)[0] == judged(r, compare.MIN_EFFECT, compare.PAIRS)[0]


def test_a_power_tally_judged_again_stops_where_measure_would_now():
    """`design --rejudge`: a recorded +5% comparison of 16 quiet pairs is called slower after FIRST_LOOK pairs, its
    seconds scaled by the pairs it needed; a recorded comparison of identical code stays same."""
    from llm_inference_harness.bench.design import rejudged

    g = np.random.default_rng(0)
    quiet = [list(0.003 * g.standard_normal(16)) for _ in range(2)]
    tally = {"design": {"min_effect": compare.MIN_EFFECT, "first_look": compare.FIRST_LOOK},
             "fractions": {"0.0": {"n": 1, "pair_logs": [quiet[0][:8]], "seconds": [20.0]},
                           "0.05": {"n": 1, "pair_logs": [[math.log(1.05) + x for x in quiet[1]]], "seconds": [60.0]}}}
    again = rejudged(tally)
    assert (again["0.0"]["called"], again["0.0"]["pairs"], again["0.0"]["seconds"]) == (0, 8, 20.0)
    expected_seconds = 60.0 * compare.FIRST_LOOK / 16
    assert (again["0.05"]["called"], again["0.05"]["pairs"], again["0.05"]["seconds"]) == (1, 8, expected_seconds)
