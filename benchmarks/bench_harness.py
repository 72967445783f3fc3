"""The harness measuring itself: a workload of known cost (harness.calibrated) timed as any benchmark is, and
how well `harness.compare` tells copies of the repository apart whose workload costs 0, 5, 10 or 20% more.

ComparisonPower runs for tens of minutes (every comparison starts two fresh workers); it is not in the quick
pass.  `python -m harness.compare --power --comparisons 200` is the same measurement with more comparisons.
"""

import torch

from benchmarks.common import require


def setup(*params):
    """asv runs this before every benchmark here: older commits without these modules are skipped."""
    require("harness.calibrated")


class Calibrated:
    """harness.calibrated.work on one thread: REPS x COST steps of (64 x 64) attention, ~5 ms."""

    def setup(self):
        from harness.calibrated import inputs

        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.x = inputs()

    def teardown(self):
        torch.set_num_threads(self.threads)

    def time_work(self):
        from harness.calibrated import work

        work(self.x)


class ComparisonPower:
    """Share of comparisons (HEAD = a copy with COST raised by ``fraction``, BASE = the original) whose verdict is
    'slower': at 0 the false-alarm rate (goal <= 0.01), at 0.05 the detection rate (goal >= 0.95)."""

    params = [[0.0, 0.05, 0.1, 0.2]]
    param_names = ["fraction"]
    timeout = 7200
    COMPARISONS = 40

    def setup_cache(self):
        from harness import compare, provenance

        if provenance.checkout() is None:
            raise NotImplementedError("needs a git checkout of the repository to copy")
        return compare.power(self.params[0], self.COMPARISONS)

    def track_slower_verdicts(self, tally, fraction):
        return tally[fraction]["slower"] / tally[fraction]["n"]

    track_slower_verdicts.unit = "fraction"

    def track_changed_verdicts(self, tally, fraction):
        """Share called slower or faster: at 0 the two-sided false-alarm rate (the gate fails on slower only)."""
        return (tally[fraction]["slower"] + tally[fraction]["faster"]) / tally[fraction]["n"]

    track_changed_verdicts.unit = "fraction"

    def track_seconds_per_comparison(self, tally, fraction):
        import statistics

        return statistics.median(tally[fraction]["seconds"])

    track_seconds_per_comparison.unit = "s"
