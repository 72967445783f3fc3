"""How `compare`'s design was chosen: verdicts on synthetic comparisons (python -m llm_inference_harness.bench.design).

Each synthetic comparison has PAIRS worker pairs of ROUNDS / PAIRS rounds.  A round's log ratio HEAD / BASE is
the true change, plus its pair's offset (normal, ``pair_sd``: a process's memory layout moves all its rounds
alike), plus the round's own noise (normal, ``round_sd``, one round in ten five times wider: a neighbour's
burst).  The rounds are judged by `compare.judge` itself; the table gives, per noise level and design, the share
of comparisons called ``slower`` at +5% and +10% and called anything but same/noisy at 0% (false alarms).  The
noise levels bracket what was measured here (docs/benchmarks.md); the design must reach >= 95% at +5% and
<= 1% false alarms at the upper one, at a cost that fits the time of a comparison.

``--from TALLY`` (a `compare.power` tally) judges comparisons drawn from the worker pairs that real comparisons
measured instead: PAIRS pairs at a time, with replacement, from all the pairs of one fraction.  It uses the
machine's own noise, but treats pairs of different comparisons as exchangeable: what all pairs of one comparison
share is averaged out, so it complements the counts of real comparisons and does not replace them.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from llm_inference_harness.bench import compare

NOISE = [(0.01, 0.02), (0.02, 0.03), (0.03, 0.03), (0.03, 0.05)]  # (pair_sd, round_sd)
# pairs, rounds, floor, and the pairs from which a comparison whose interval lies within or beyond the floor stops
# (`compare.settled`)
DESIGNS = [(10, 40, 0.05, 10), (10, 40, 0.025, 10), (compare.PAIRS, compare.ROUNDS, compare.MIN_EFFECT, compare.PAIRS),
           (compare.PAIRS, compare.ROUNDS, compare.MIN_EFFECT, compare.FIRST_LOOK)]


def synthetic(change: float, pairs: int, rounds: int, pair_sd: float, round_sd: float, rng) -> compare.Result:
    import numpy as np

    per_pair = rounds // pairs
    n = pairs * per_pair
    offset = np.repeat(pair_sd * rng.standard_normal(pairs), per_pair)
    noise = np.where(rng.random(n) < 0.1, 5 * round_sd, round_sd) * rng.standard_normal(n)
    a = np.full(n, 0.01)
    b = a * np.exp(np.log1p(change) + offset + noise)
    pair_of = np.repeat(np.arange(pairs), per_pair)
    return compare.Result("bench_x.C.time_f", (), a=list(a), b=list(b), pairs=list(pair_of))


def alarms(change: float) -> tuple[str, ...]:
    """The verdicts that count against a design at ``change``: slower, or at 0 (a false alarm) slower or faster."""
    return ("slower",) if change else ("slower", "faster")


def from_pair_logs(logs) -> compare.Result:
    """A comparison of one round per pair whose rounds' log ratios are ``logs``: judged as the pairs' estimates."""
    return compare.Result("bench_x.C.time_f", (), a=[1.0] * len(logs), b=[math.exp(x) for x in logs],
                          pairs=list(range(len(logs))))


def rates(pairs: int, rounds: int, floor: float, first_look: int, pair_sd: float, round_sd: float, n: int,
          seed: int) -> dict:
    """{change: (share of n synthetic comparisons called slower -- at 0, slower or faster --, the mean pairs they
    measured)} under one design."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for change in (0.05, 0.10, 0.0):
        runs = [judged(synthetic(change, pairs, rounds, pair_sd, round_sd, rng), floor, first_look) for _ in range(n)]
        out[change] = (sum(verdict in alarms(change) for verdict, _ in runs) / n, float(np.mean([p for _, p in runs])))
    return out


def judged(r: compare.Result, floor: float, first_look: int) -> tuple[str, int]:
    """(verdict, pairs measured) as `compare.measure` reaches it: from the ``first_look``-th pair on, judged on the
    pairs so far after the first pair that settles it, else on all of them."""
    pairs = len(set(r.pairs))
    for p in range(first_look, pairs):
        k = r.pairs.index(p)  # the rounds of the first p pairs
        so_far = compare.Result(r.name, r.params, a=r.a[:k], b=r.b[:k], pairs=r.pairs[:k])
        if compare.settled(so_far, floor):
            return compare.judge(so_far, min_effect=floor).verdict, p
    return compare.judge(r, min_effect=floor).verdict, pairs


def rejudged(tally: dict) -> dict[str, dict]:
    """{fraction: {"called", "n", "pairs", "seconds"}} of a `compare.power` tally, its comparisons judged again from
    their recorded pair estimates as `compare.measure` would judge them now (`judged`): how many were called changed
    (at 0) or slower, the mean pairs measured, and the mean seconds scaled by pairs measured now over pairs measured
    then (an estimate: a pair's cost is most of a comparison's).  Exact for a rule that stops no later than the one
    that measured the tally, since every pair it looks at was measured."""
    out = {}
    for fraction, t in tally["fractions"].items():
        called, pairs, seconds = 0, [], []
        for logs, spent in zip(t["pair_logs"], t["seconds"], strict=True):
            verdict, used = judged(from_pair_logs(logs), tally["design"]["min_effect"], tally["design"]["first_look"])
            called += verdict in alarms(float(fraction))
            pairs.append(used)
            seconds.append(spent * used / len(logs))
        out[fraction] = {"called": called, "n": t["n"], "pairs": sum(pairs) / len(pairs),
                         "seconds": sum(seconds) / len(seconds)}
    return out


def resampled(tally: dict, n: int, seed: int = 0) -> dict[str, tuple[float, int, int]]:
    """{fraction: (share of n comparisons drawn from its measured pairs called slower -- at 0 slower or faster --,
    its comparisons, its pairs)} of a `compare.power` tally."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for fraction, t in tally["fractions"].items():
        pool = np.array([x for logs in t["pair_logs"] for x in logs])
        if not len(pool):
            continue
        pairs = tally["design"]["pairs"]
        called = sum(compare.judge(from_pair_logs(rng.choice(pool, pairs))).verdict in alarms(float(fraction))
                     for _ in range(n))
        out[fraction] = (called / n, t["n"], len(pool))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_inference_harness.bench.design",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--comparisons", type=int, default=2000, help="synthetic comparisons per cell")
    parser.add_argument("--from", dest="tally", type=Path, metavar="TALLY", help="resample this power tally's pairs")
    parser.add_argument("--rejudge", type=Path, metavar="TALLY", help="judge this power tally's comparisons again")
    args = parser.parse_args()
    if args.rejudge:
        for fraction, t in rejudged(json.loads(args.rejudge.read_text())).items():
            print(f"+{float(fraction):.0%}: {t['called']} of {t['n']} comparisons called "
                  f"{'changed' if float(fraction) == 0 else 'slower'}, {t['pairs']:.1f} pairs and about "
                  f"{t['seconds']:.0f} s a comparison")
        return 0
    if args.tally:
        for fraction, (share, comparisons, pairs) in resampled(json.loads(args.tally.read_text()),
                                                               args.comparisons).items():
            print(f"+{float(fraction):.0%}: {share:.2%} of {args.comparisons} comparisons drawn from the {pairs} pairs "
                  f"of {comparisons} measured comparisons called {'changed' if float(fraction) == 0 else 'slower'}")
        return 0
    print("pair sd  round sd  pairs x rounds  floor  first look  +5% slower  +10% slower  0% false alarms  "
          "pairs measured at 0% / +5%")
    for pair_sd, round_sd in NOISE:
        for pairs, rounds, floor, first_look in DESIGNS:
            r = rates(pairs, rounds, floor, first_look, pair_sd, round_sd, args.comparisons, seed=0)
            print(f"{pair_sd:7.2f}  {round_sd:8.2f}  {pairs:5d} x {rounds // pairs:<6d} {floor:5.3f}  "
                  f"{first_look:10d}  {r[0.05][0]:10.1%}  {r[0.10][0]:11.1%}  {r[0.0][0]:15.2%}  "
                  f"{r[0.0][1]:13.1f} / {r[0.05][1]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
