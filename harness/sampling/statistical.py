"""The statistical tier: a goodness-of-fit test of sampled outputs against exact probabilities, for
samplers that draw their own randomness and so cannot be enumerated.

Pearson's chi-square over the k possible outputs, at false-alarm rate alpha.  Its power against any
alternative at total-variation distance delta is at least that against noncentrality
lambda = n * sum((p1 - p0)^2 / p0) >= 4 n delta^2 (Cauchy-Schwarz: (sum |p1 - p0|)^2 <= sum (p1 - p0)^2 / p0),
so the sample size is the least n with P(chi2'(k - 1, 4 n delta^2) > chi2_{1-alpha}(k - 1)) >= power.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from scipy import stats

# The promise of the statistical verdict: it detects a total-variation distance of DELTA with probability
# >= POWER and raises a false alarm on a correct sampler with probability ALPHA.
DELTA, POWER, ALPHA = 0.05, 0.99, 0.001


def power(n: int, cells: int, delta: float = DELTA, alpha: float = ALPHA) -> float:
    """The least power of the chi-square test with n samples against alternatives at TV distance delta."""
    critical = stats.chi2.ppf(1 - alpha, cells - 1)
    return float(stats.ncx2.sf(critical, cells - 1, 4 * n * delta**2))


def sample_size(cells: int, delta: float = DELTA, alpha: float = ALPHA, target_power: float = POWER) -> int:
    """The least n whose power() reaches target_power (bisection; power grows with n)."""
    lo, hi = 1, 2
    while power(hi, cells, delta, alpha) < target_power:
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if power(mid, cells, delta, alpha) < target_power else (lo, mid)
    return lo


@dataclass(frozen=True)
class Fit:
    n: int
    statistic: float
    p_value: float
    impossible: dict  # outputs sampled that have probability 0
    tvd: float  # total variation between the empirical and the exact distribution

    @property
    def rejected(self) -> bool:
        return bool(self.impossible) or self.p_value < ALPHA

    def describe(self) -> str:
        return (f"chi-square over {self.n} samples: statistic {self.statistic:.1f}, p = {self.p_value:.3g} "
                f"(alarm below {ALPHA:g}), empirical TV {self.tvd:.3f}"
                + (f"; impossible outputs {self.impossible}" if self.impossible else ""))


def goodness_of_fit(samples: list[Hashable], exact: dict[Hashable, float]) -> Fit:
    counts = Counter(samples)
    n = len(samples)
    cells = sorted(exact, key=repr)
    impossible = {c: k for c, k in counts.items() if exact.get(c, 0.0) == 0.0}
    observed = [counts.get(c, 0) for c in cells]
    expected = [sum(observed) * exact[c] for c in cells]  # over the possible outputs: an impossible one rejects alone
    statistic, p_value = stats.chisquare(observed, expected) if sum(observed) else (float("inf"), 0.0)
    tvd = 0.5 * sum(abs(counts.get(c, 0) / n - exact.get(c, 0.0)) for c in set(exact) | set(counts))
    return Fit(n, float(statistic), float(p_value), impossible, tvd)
