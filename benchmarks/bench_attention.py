"""Attention forward: time and achieved GFLOP/s for every registered implementation.

The oracle (float64 by construction) is left out of the timing grid.
"""

import os

import torch

from benchmarks.common import DEVICES, impl_names, require, resolve_device, resolve_impl, sync


def setup(*params):
    """asv runs this before every benchmark here: older commits without these modules are skipped."""
    require("harness.contracts.attention", "impls.attention.merge")


IMPLS = [n for n in impl_names("attention") if n != "reference"]
SHAPES = ["1x8x512x64", "1x8x2048x64"]  # B x H x N x d


class AttentionForward:
    params = [IMPLS, DEVICES, SHAPES, [False, True]]
    param_names = ["impl", "device", "shape", "causal"]
    timeout = 300

    def setup(self, impl, device, shape, causal):
        self.device = resolve_device(device)
        self.fn = resolve_impl("attention", impl, self.device).fn
        B, H, N, d = map(int, shape.split("x"))
        g = torch.Generator().manual_seed(0)
        self.q, self.k, self.v = (torch.randn(B, H, N, d, generator=g).to(self.device) for _ in range(3))
        self.causal = causal
        self.flops = 4 * B * H * N * N * d * (0.5 if causal else 1.0)  # two matmuls; causal halves the work

    def time_forward(self, impl, device, shape, causal):
        self.fn(self.q, self.k, self.v, causal=self.causal)
        sync(self.device)

    def track_gflops(self, impl, device, shape, causal):
        """Achieved GFLOP/s (higher is better), median of a few calls timed in one process."""
        import torch.utils.benchmark as tb

        timer = tb.Timer("fn(q, k, v, causal=c); sync(dev)", globals={
            "fn": self.fn, "q": self.q, "k": self.k, "v": self.v, "c": self.causal, "sync": sync, "dev": self.device})
        return self.flops / timer.blocked_autorange(min_run_time=0.5).median / 1e9

    track_gflops.unit = "GFLOP/s"


class SdpaRatio:
    """Best tiled implementation / SDPA, measured in one process (B=1, H=8, N=2048, d=64, causal, fp32).

    Every tiled candidate is timed once; the three fastest and SDPA then take turns for ROUNDS rounds
    (best of two calls each), and the result is the median over rounds of (fastest candidate / SDPA):
    load that comes and goes on a shared machine hits both sides of each round's ratio."""

    params = [DEVICES, ["1", "all"]]
    param_names = ["device", "cpu_threads"]
    timeout = 600
    ROUNDS = 7

    def setup(self, device, cpu_threads):
        self.threads = torch.get_num_threads()  # first: teardown runs even when setup skips
        self.device = resolve_device(device)
        if cpu_threads == "1" and self.device.type != "cpu":
            raise NotImplementedError("the thread count is a CPU parameter")
        torch.set_num_threads(1 if cpu_threads == "1" else os.cpu_count() or 1)  # both sides get the same cores
        g = torch.Generator().manual_seed(0)
        self.qkv = [torch.randn(1, 8, 2048, 64, generator=g).to(self.device) for _ in range(3)]
        runnable = [impl for impl in map(self._runnable, IMPLS) if impl is not None]
        self.tiled = {impl.name: impl.fn for impl in runnable if impl.cap("tiled")}
        self.sdpa = resolve_impl("attention", "sdpa", self.device).fn

    def _runnable(self, name):
        try:
            return resolve_impl("attention", name, self.device)
        except NotImplementedError:  # e.g. a CUDA-only kernel on a CPU machine: not a candidate here
            return None

    def _seconds(self, fn, calls: int = 2) -> float:
        import time

        q, k, v = self.qkv
        best = float("inf")
        for _ in range(calls):
            start = time.perf_counter()
            fn(q, k, v, causal=True)
            sync(self.device)
            best = min(best, time.perf_counter() - start)
        return best

    def ratios(self) -> dict[str, float]:
        """{candidate: median over rounds of its time / SDPA's} for the three fastest candidates."""
        import statistics

        first = sorted(self.tiled, key=lambda name: self._seconds(self.tiled[name], calls=1))[:3]
        rounds: dict[str, list[float]] = {name: [] for name in first}
        for _ in range(self.ROUNDS):
            sdpa = self._seconds(self.sdpa)
            for name in first:
                rounds[name].append(self._seconds(self.tiled[name]) / sdpa)
        return {name: statistics.median(r) for name, r in rounds.items()}

    def teardown(self, device, cpu_threads):
        torch.set_num_threads(self.threads)

    def track_best_tiled_over_sdpa(self, device, cpu_threads):
        """Lower is better: 1.0 means the best tiled kernel matches SDPA."""
        return min(self.ratios().values())

    track_best_tiled_over_sdpa.unit = "ratio"


class AttentionDecode:
    """One query against a long KV cache (B=1, H=8, d=64): where split-K decoding is meant to help."""

    params = [IMPLS, DEVICES, [4096]]
    param_names = ["impl", "device", "Nk"]
    timeout = 300

    def setup(self, impl, device, Nk):
        self.device = resolve_device(device)
        self.fn = resolve_impl("attention", impl, self.device).fn
        g = torch.Generator().manual_seed(0)
        self.q = torch.randn(1, 8, 1, 64, generator=g).to(self.device)
        self.k, self.v = (torch.randn(1, 8, Nk, 64, generator=g).to(self.device) for _ in range(2))

    def time_decode(self, impl, device, Nk):
        self.fn(self.q, self.k, self.v, causal=True)
        sync(self.device)


class ModelledHBMTraffic:
    """HBM bytes the IO model (harness/iomodel.py) charges an implementation's loop order, fp32,
    B=1, H=8, N=2048, d=64, non-causal; implementations that declare no ``io`` loop order are n/a."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        from harness import iomodel

        record = resolve_impl("attention", impl, torch.device("cpu"))
        B, H, N, d = 1, 8, 2048, 64
        per_head = {
            "standard": lambda: iomodel.standard_traffic(N, N, d),
            "fa1": lambda: iomodel.fa1_traffic(N, N, d, record.cap("Bc")),
            "fa2": lambda: iomodel.fa2_traffic(N, N, d, record.cap("Br")),
        }.get(record.cap("io"))
        if per_head is None:
            raise NotImplementedError(f"{impl} declares no io loop order")
        self.bytes = B * H * per_head() * 4

    def track_modelled_hbm_bytes(self, impl):
        return self.bytes

    track_modelled_hbm_bytes.unit = "bytes"
