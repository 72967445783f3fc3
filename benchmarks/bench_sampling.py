"""Sampling: tokens per second against the vocabulary and the batch size, the sorting-free rejection sampler
against the sort-based one, and the exact enumeration of the V = 8 parameter grid (the goal: at most 10 s).

Every row samples with temperature 0.8, top-k 50, top-p 0.9, min-p 0.05 and a repetition penalty of 1.1 on a 64-token
history (the parameters an implementation does not apply stay off).  Samplers draw through
llm_inference_harness.sampling.lm.TorchRng, or from a seed when they declare rng="own"; processors (returns="probs") are
timed processing.
"""

import torch

from benchmarks.common import DEVICES, impl_names, median_seconds, require, resolve_device, resolve_impl, sync
from benchmarks.invariance_cost import alternating_ratio


def setup(*params):
    """asv runs this before every benchmark here: older commits without these modules are skipped."""
    require("llm_inference_harness.contracts.sampling", "llm_inference_harness.references.sampling",
            "llm_inference_harness.strategies.sampling")


IMPLS = impl_names("sampling")
VOCABS = [1024, 32768]
BATCHES = [1, 16, 64]
VALUES = {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1}


def workload(impl, vocab: int, batch: int, device: torch.device):
    """(call, logits, params): one call of the implementation on a seeded batch; NotImplementedError past its
    declared vocabulary."""
    from llm_inference_harness.contracts.sampling import OFF, sampling_params
    from llm_inference_harness.sampling.lm import TorchRng

    if impl.caps.max_vocab and vocab > impl.caps.max_vocab:
        raise NotImplementedError(f"{impl.name} serves V <= {impl.caps.max_vocab}")
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(batch, vocab, generator=g) * 3).to(device)  # (B, V)
    history = [tuple(torch.randint(vocab, (64,), generator=g).tolist())] * batch
    params = sampling_params(batch, **{k: v if k in impl.caps.params else OFF[k] for k, v in VALUES.items()},
                             prompt_tokens=history, output_tokens=history)
    if impl.caps.returns == "probs":
        return lambda: impl.fn(logits, params)
    rng = 0 if impl.caps.rng == "own" else TorchRng(0, device.type)
    return lambda: impl.fn(logits, params, rng=rng)


class TokensPerSecond:
    """One token per row of a batch (a processor: the processed distribution of every row)."""

    params = [IMPLS, DEVICES, VOCABS, BATCHES]
    param_names = ["impl", "device", "vocab", "batch"]

    def setup(self, impl, device, vocab, batch):
        self.device = resolve_device(device)
        self.call = workload(resolve_impl("sampling", impl, self.device), vocab, batch, self.device)
        self.call()  # the first call of an op, a kernel's compile, the adapter's import

    def time_sample(self, impl, device, vocab, batch):
        self.call()
        sync(self.device)

    def track_tokens_per_second(self, impl, device, vocab, batch):
        return batch / median_seconds(lambda: (self.call(), sync(self.device)), 5)

    track_tokens_per_second.unit = "tokens/s"


class SortFreeRatio:
    """Seconds of the sorting-free rejection sampler over the sort-based one on the same batch of 16, measured in
    alternation within one process (below 1: sorting-free is faster)."""

    params = [VOCABS]
    param_names = ["vocab"]

    def setup(self, vocab):
        cpu = torch.device("cpu")
        self.rejection = workload(resolve_impl("sampling", "rejection", cpu), vocab, 16, cpu)
        self.sort_based = workload(resolve_impl("sampling", "sort_based", cpu), vocab, 16, cpu)

    def track_rejection_over_sort_based(self, vocab):
        return alternating_ratio(self.rejection, self.sort_based, rounds=5)

    track_rejection_over_sort_based.unit = "rejection s / sort-based s"


def _grid_enumeration(impl):
    """Seconds and sampler runs to enumerate every point of the V = 8 parameter grid exactly, point by point."""
    import time

    from llm_inference_harness.sampling.enumeration import explore
    from llm_inference_harness.strategies.sampling import parameter_grid

    logits, params = parameter_grid(impl.caps.params)
    runs, start = 0, time.perf_counter()
    for b in range(len(logits)):
        row, p = logits[b : b + 1], params.select([b])
        runs += sum(1 for _ in explore(lambda rng, row=row, p=p: tuple(impl.fn(row, p, rng=rng).tolist())))
    return time.perf_counter() - start, runs


class EnumerationGrid:
    """The exact output distribution of every point of the V = 8 parameter grid (192 points; goal <= 10 s)."""

    params = [IMPLS]
    param_names = ["impl"]
    timeout = 300

    def setup(self, impl):
        self.impl = resolve_impl("sampling", impl, torch.device("cpu"), "float64")
        if self.impl.caps.returns == "probs" or self.impl.caps.rng == "own":
            raise NotImplementedError(f"{impl}: nothing to enumerate (a processor, or its own generator)")

    def track_seconds(self, impl):
        return _grid_enumeration(self.impl)[0]

    track_seconds.unit = "s"

    def track_runs(self, impl):
        return _grid_enumeration(self.impl)[1]

    track_runs.unit = "sampler runs"
