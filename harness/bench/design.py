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
from pathlib import Path

from llm_inference_harness.bench import compare

NOISE = [(0.02, 0.03), (0.03, 0.03), (0.03, 0.05)]  # (pair_sd, round_sd)
DESIGNS = [(10, 40, 0.05), (10, 40, 0.025), (compare.PAIRS, compare.ROUNDS, compare.MIN_EFFECT)]  # pairs, rounds, floor


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


def rates(pairs: int, rounds: int, floor: float, pair_sd: float, round_sd: float, n: int, seed: int) -> dict:
    """{change: share of n synthetic comparisons called slower (or, at 0, slower or faster)} under one design."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for change in (0.05, 0.10, 0.0):
        alarm = ("slower",) if change else ("slower", "faster")
        out[change] = sum(compare.judge(synthetic(change, pairs, rounds, pair_sd, round_sd, rng),
                                        min_effect=floor).verdict in alarm for _ in range(n)) / n
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
        alarm = ("slower", "faster") if float(fraction) == 0 else ("slower",)
        pairs = tally["design"]["pairs"]
        called = sum(compare.judge(compare.Result("bench_x.C.time_f", (), a=[1.0] * pairs,
                                                  b=list(np.exp(rng.choice(pool, pairs))),
                                                  pairs=list(range(pairs)))).verdict in alarm for _ in range(n))
        out[fraction] = (called / n, t["n"], len(pool))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_inference_harness.bench.design",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--comparisons", type=int, default=2000, help="synthetic comparisons per cell")
    parser.add_argument("--from", dest="tally", type=Path, metavar="TALLY", help="resample this power tally's pairs")
    args = parser.parse_args()
    if args.tally:
        for fraction, (share, comparisons, pairs) in resampled(json.loads(args.tally.read_text()),
                                                               args.comparisons).items():
            print(f"+{float(fraction):.0%}: {share:.2%} of {args.comparisons} comparisons drawn from the {pairs} pairs "
                  f"of {comparisons} measured comparisons called {'changed' if float(fraction) == 0 else 'slower'}")
        return 0
    print("pair sd  round sd  pairs x rounds  floor   +5% slower  +10% slower  0% false alarms")
    for pair_sd, round_sd in NOISE:
        for pairs, rounds, floor in DESIGNS:
            r = rates(pairs, rounds, floor, pair_sd, round_sd, args.comparisons, seed=0)
            print(f"{pair_sd:7.2f}  {round_sd:8.2f}  {pairs:5d} x {rounds // pairs:<6d} {floor:5.3f}  {r[0.05]:10.1%}  "
                  f"{r[0.10]:11.1%}  {r[0.0]:15.2%}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
