"""Shared by the `BatchInvarianceCost` benchmarks: a time ratio measured in alternation, and the fastest of
several candidate implementations.

Timing both sides in turn within one round means load that comes and goes on a shared machine hits both,
so the median of the rounds' ratios is steadier than two separate medians.
"""

import statistics
import time

import torch

from benchmarks.common import median_seconds, sync


def alternating_ratio(numerator, denominator, rounds: int = 7, device: torch.device | None = None) -> float:
    """Median over ``rounds`` of (numerator's time / denominator's), the two called in turn, best of two calls
    each (CUDA synchronized)."""

    def best(fn) -> float:
        times = []
        for _ in range(2):
            start = time.perf_counter()
            fn()
            if device is not None:
                sync(device)
            times.append(time.perf_counter() - start)
        return min(times)

    return statistics.median(best(numerator) / best(denominator) for _ in range(rounds))


def fastest(candidates: dict, run) -> str:
    """The name of the candidate whose ``run(candidate)`` takes least time, each called twice, best call kept."""
    return min(candidates, key=lambda name: min(median_seconds(lambda: run(candidates[name]), 1) for _ in range(2)))
