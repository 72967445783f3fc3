"""The harness measuring itself: a workload of known cost (llm_inference_harness.bench.calibrated) timed as any
benchmark is, and how well `llm_inference_harness.bench.compare` tells copies of the repository apart whose workload
costs 0, 5, 10 or 20% more.

ComparisonPower runs for tens of minutes (every comparison starts two fresh workers); it is not in the quick
pass.  `python -m llm_inference_harness.bench.compare --power --comparisons 200` is the same measurement with more
comparisons.
"""

import torch

from benchmarks.common import require


def setup(*params):
    """asv runs this before every benchmark here: older commits without these modules are skipped."""
    require("llm_inference_harness.bench.calibrated")


class Calibrated:
    """llm_inference_harness.bench.calibrated.work on one thread: REPS x COST steps of (64 x 64) attention, ~5 ms."""

    def setup(self):
        from llm_inference_harness.bench.calibrated import inputs

        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.x = inputs()

    def teardown(self):
        torch.set_num_threads(self.threads)

    def time_work(self):
        from llm_inference_harness.bench.calibrated import work

        work(self.x)


class ComparisonPower:
    """Share of comparisons (HEAD = a copy with COST raised by ``fraction``, BASE = the original) whose verdict is
    'slower': at 0 the false-alarm rate (goal <= 0.01), at 0.05 the detection rate (goal >= 0.95)."""

    params = [[0.0, 0.05, 0.1, 0.2]]
    param_names = ["fraction"]
    timeout = 7200
    COMPARISONS = 40

    def setup_cache(self):
        from llm_inference_harness.bench import compare
        from llm_inference_harness.engine import provenance

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


class BoundaryCall:
    """What the boundary between the judge and the implementation's process costs (harness/engine/boundary.py):
    one small attention call (B=1, H=2, N=16, d=16, under the guard the properties use), one step of a block
    manager (an allocate and a free, each bringing back the snapshot of the manager's observables), and one exact
    enumeration (the standard sampler on a context table, V=6, gamma 2, T 3: ~2,000 runs in batches), in the
    implementation's own process and in this one."""

    params = [["attention", "block_manager_step", "enumeration"], ["isolated", "in_process"]]
    param_names = ["case", "where"]

    def setup(self, case, where):
        require("llm_inference_harness.engine.boundary")
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as `harness check` runs both processes beside other checks: one thread each
        technique, name = {"attention": ("attention", "naive"), "block_manager_step": ("block_manager", "simple"),
                           "enumeration": ("speculative", "standard")}[case]
        self.impl = _opened(technique, name, where)  # forked before this process computes anything
        self.step = getattr(self, f"_{case}")()

    def teardown(self, case, where):
        torch.set_num_threads(self.threads)
        if where == "isolated":
            self.impl.fn.process.close()

    def _attention(self):
        from llm_inference_harness.contracts.attention import call

        q = torch.randn(1, 2, 16, 16)
        return lambda: call(self.impl, q, q, q, causal=True, scale=None)

    def _block_manager_step(self):
        from llm_inference_harness.contracts.block_manager import NullStorage, open_manager

        manager, tokens = open_manager(self.impl, 64, 4, NullStorage(), timed=False), list(range(10))
        return lambda: (manager.allocate(0, tokens), manager.free(0))

    def _enumeration(self):
        from llm_inference_harness.sampling.enumeration import exact_distribution
        from llm_inference_harness.sampling.lm import TableLM
        from llm_inference_harness.strategies.speculative import probability_table

        g = torch.Generator().manual_seed(0)
        target, draft = (TableLM(probability_table(6, 1, z, g)) for z in (0.0, 0.3))
        return lambda: exact_distribution(self.impl.fn, target, draft, [0], gamma=2, T=3, workers=1)

    def time_step(self, case, where):
        self.step()


def _opened(technique: str, name: str, where: str):
    """The registered implementation, in its own process (as `harness check` runs it) or in this one."""
    from llm_inference_harness.engine.registry import get
    from llm_inference_harness.engine.runner import Target, open_isolated

    if where == "in_process":
        return get(technique, name)
    return open_isolated(Target(technique, name=name), one_thread=True)
