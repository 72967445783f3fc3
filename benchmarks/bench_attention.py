"""Attention forward: time and achieved GFLOP/s for every registered implementation vs N (128 ... 4096;
the CPU stops at 2048), the best tiled kernel / SDPA ratio, compiled FlexAttention / SDPA, the Triton
kernel's TFLOP/s against SDPA's on CUDA, split-K decode, and the IO model's HBM traffic.  The oracle
(float64 by construction) is left out of the timing grid.
"""

import os

import torch

from benchmarks.common import (
    DEVICES,
    KERNEL_HEAD_DIMS,
    KERNEL_LENGTHS,
    checked_at_scale,
    cuda_seconds,
    impl_names,
    paper_shape,
    require,
    resolve_device,
    resolve_impl,
    sync,
)
from benchmarks.invariance_cost import alternating_ratio, fastest


def setup(*params):
    """asv runs this before every benchmark here: older commits without these modules are skipped."""
    require("llm_inference_harness.contracts.attention")


IMPLS = [n for n in impl_names("attention") if n != "reference"]
SHAPES = ["1x8x128x64", "1x8x512x64", "1x8x2048x64", "1x8x4096x64"]  # B x H x N x d
CPU_MAX_LEN = 2048  # at 4096 the naive kernel holds 512 MiB score matrices and eager flex takes seconds a call


class AttentionForward:
    params = [IMPLS, DEVICES, SHAPES, [False, True]]
    param_names = ["impl", "device", "shape", "causal"]
    timeout = 300

    def setup(self, impl, device, shape, causal):
        self.device = resolve_device(device)
        B, H, N, d = map(int, shape.split("x"))
        if self.device.type == "cpu" and N > CPU_MAX_LEN:
            raise NotImplementedError(f"N={N} is not affordable on CPU (limit {CPU_MAX_LEN})")
        self.fn = resolve_impl("attention", impl, self.device).fn
        g = torch.Generator().manual_seed(0)
        self.q, self.k, self.v = (torch.randn(B, H, N, d, generator=g).to(self.device) for _ in range(3))
        self.causal = causal
        self.flops = 4 * B * H * N * N * d * (0.5 if causal else 1.0)  # two matmuls; causal halves the work
        checked_at_scale(self.fn, self.q, self.k, self.v, causal=causal)

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


def best_seconds(fn, qkv, device, calls: int = 2) -> float:
    """The fastest of `calls` causal calls of fn(q, k, v), in seconds (CUDA synchronized)."""
    import time

    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        fn(*qkv, causal=True)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


class SdpaRatio:
    """Best tiled implementation / SDPA, measured in one process (B=1, H=8, N=2048, d=64, causal, fp32).

    Every tiled candidate is timed once; the three fastest and SDPA then take turns for ROUNDS rounds
    (best of two calls each).  The goal's measure is the median over rounds of (candidate / SDPA): load
    that comes and goes on a shared machine hits both sides of each round's ratio.  Beside it, the ratio
    of the fastest calls."""

    params = [DEVICES, ["1", "all"]]
    param_names = ["device", "cpu_threads"]
    timeout = 600
    ROUNDS = 15  # 7-round windows of one process were seen to differ by 20% on this shared machine

    def setup(self, device, cpu_threads):
        self.threads = torch.get_num_threads()
        self.device = resolve_device(device)
        if cpu_threads == "1" and self.device.type != "cpu":
            raise NotImplementedError("the thread count is a CPU parameter")
        torch.set_num_threads(1 if cpu_threads == "1" else os.cpu_count() or 1)  # both sides get the same cores
        g = torch.Generator().manual_seed(0)
        self.qkv = [torch.randn(1, 8, 2048, 64, generator=g).to(self.device) for _ in range(3)]
        runnable = [impl for impl in map(self._runnable, IMPLS) if impl is not None]
        self.tiled = {impl.name: impl.fn for impl in runnable if impl.caps.tiled}
        self.sdpa = resolve_impl("attention", "sdpa", self.device).fn

    def _runnable(self, name):
        try:
            return resolve_impl("attention", name, self.device)
        except NotImplementedError:  # e.g. a CUDA-only kernel on a CPU machine: not a candidate here
            return None

    def rounds(self) -> tuple[list[float], dict[str, list[float]]]:
        """SDPA's seconds and the three fastest candidates' seconds, round by round (best of two calls each)."""
        first = sorted(self.tiled, key=lambda name: best_seconds(self.tiled[name], self.qkv, self.device, 1))[:3]
        sdpa, tiled = [], {name: [] for name in first}
        for _ in range(self.ROUNDS):
            sdpa.append(best_seconds(self.sdpa, self.qkv, self.device))
            for name, times in tiled.items():
                times.append(best_seconds(self.tiled[name], self.qkv, self.device))
        return sdpa, tiled

    def ratios(self) -> dict[str, float]:
        """{candidate: median over rounds of its time / SDPA's}: the goal's measure.  The track method that
        reads it keeps its source, so asv's version of it, and the results already measured, stay current."""
        import statistics

        sdpa, tiled = self.rounds()
        return {name: statistics.median(t / s for t, s in zip(times, sdpa, strict=True))
                for name, times in tiled.items()}

    def teardown(self, device, cpu_threads):
        torch.set_num_threads(getattr(self, "threads", torch.get_num_threads()))  # the module's setup may skip first

    def track_best_tiled_over_sdpa(self, device, cpu_threads):
        """Lower is better: 1.0 means the best tiled kernel matches SDPA."""
        return min(self.ratios().values())

    track_best_tiled_over_sdpa.unit = "ratio"

    def track_fastest_calls_tiled_over_sdpa(self, device, cpu_threads):
        """The best tiled kernel's fastest call over SDPA's fastest call in the same rounds: what each costs
        when nothing else runs (timeit's reading).  Beside the median it shows how much of the gap is load."""
        sdpa, tiled = self.rounds()
        return min(min(times) for times in tiled.values()) / min(sdpa)

    track_fastest_calls_tiled_over_sdpa.unit = "ratio"


class FlexCompiled:
    """torch.compile(flex_attention) -- the fused FlexAttention kernel -- at B=1, H=8, N=2048, d=64, causal,
    fp32, and its time / SDPA's, the two taking turns.  Compiling takes seconds (once per process, in
    setup); where it cannot run (no C++ compiler, no Triton) the benchmark is skipped, saying why."""

    params = [DEVICES]
    param_names = ["device"]
    timeout = 600
    ROUNDS = 9

    def setup(self, device):
        import functools

        self.device = resolve_device(device)
        g = torch.Generator().manual_seed(0)
        self.qkv = [torch.randn(1, 8, 2048, 64, generator=g).to(self.device) for _ in range(3)]
        self.sdpa = resolve_impl("attention", "sdpa", self.device).fn
        try:
            flex = resolve_impl("attention", "flex", self.device).fn
            self.flex = functools.partial(flex, compiled=True)
            self.flex(*self.qkv, causal=True)  # compiles
        except Exception as exc:  # any compile failure means: nothing to time here
            raise NotImplementedError(f"torch.compile(flex_attention) does not run here: {exc}") from exc

    def time_forward(self, device):
        self.flex(*self.qkv, causal=True)
        sync(self.device)

    def track_flex_compiled_over_sdpa(self, device):
        """Median over rounds of (compiled flex / SDPA); lower is better."""
        import statistics

        return statistics.median(best_seconds(self.flex, self.qkv, self.device) /
                                 best_seconds(self.sdpa, self.qkv, self.device) for _ in range(self.ROUNDS))

    track_flex_compiled_over_sdpa.unit = "ratio"


class KernelTflops:
    """Forward TFLOP/s of the fused GPU kernels -- the Triton FlashAttention-2 kernel against SDPA -- in
    bfloat16 at the FlashAttention-2 paper's shapes.  CUDA only: on a CPU every case is n/a."""

    params = [["triton_fa2", "sdpa"], ["cuda"], KERNEL_LENGTHS, KERNEL_HEAD_DIMS, [False, True]]
    param_names = ["impl", "device", "N", "d", "causal"]
    timeout = 120

    def setup(self, impl, device, N, d, causal):
        self.device = resolve_device(device)
        self.fn = resolve_impl("attention", impl, self.device, "bfloat16").fn
        B, H, N, d = paper_shape(N, d)
        g = torch.Generator(self.device).manual_seed(0)
        self.q, self.k, self.v = (torch.randn(B, H, N, d, generator=g, device=self.device, dtype=torch.bfloat16)
                                  for _ in range(3))
        self.causal = causal
        checked_at_scale(self.fn, self.q, self.k, self.v, causal=causal)
        self.flops = 4 * B * H * N * N * d * (0.5 if causal else 1.0)

    def track_tflops(self, impl, device, N, d, causal):
        return self.flops / cuda_seconds(lambda: self.fn(self.q, self.k, self.v, causal=self.causal)) / 1e12

    track_tflops.unit = "TFLOP/s"


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
        checked_at_scale(self.fn, self.q, self.k, self.v, causal=True)

    def time_decode(self, impl, device, Nk):
        self.fn(self.q, self.k, self.v, causal=True)
        sync(self.device)


class ModelledHBMTraffic:
    """HBM bytes the IO model (harness/analytic/iomodel.py) charges an implementation's loop order, fp32,
    B=1, H=8, N=2048, d=64, non-causal; implementations that declare no ``io`` loop order are n/a."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        from llm_inference_harness.analytic import iomodel

        record = resolve_impl("attention", impl, torch.device("cpu"))
        B, H, N, d = 1, 8, 2048, 64
        per_head = {
            "standard": lambda: iomodel.standard_traffic(N, N, d),
            "fa1": lambda: iomodel.fa1_traffic(N, N, d, record.caps.Bc),
            "fa2": lambda: iomodel.fa2_traffic(N, N, d, record.caps.Br),
        }.get(record.caps.io)
        if per_head is None:
            raise NotImplementedError(f"{impl} declares no io loop order")
        self.bytes = B * H * per_head() * 4

    def track_modelled_hbm_bytes(self, impl):
        return self.bytes

    track_modelled_hbm_bytes.unit = "bytes"


class BatchInvarianceCost:
    """The cost of batch invariance: the fixed-order kernel (impls/attention/batch_invariant.py) over the
    fastest registered kernel that declares no invariance, B=4, H=8, N=256, d=64, causal, float32, timed in
    turn within one run (median of 7 rounds' ratios).  On a CPU the fixed order is spelled out as one
    elementwise op per term (no BLAS), so this is the price of that emulation; a GPU kernel with one tile
    configuration and no split-K pays far less."""

    params = [DEVICES]
    param_names = ["device"]
    timeout = 600

    def setup(self, device):
        from llm_inference_harness.engine.registry import impls

        self.device = resolve_device(device)
        g = torch.Generator().manual_seed(0)
        self.qkv = [torch.randn(4, 8, 256, 64, generator=g).to(self.device) for _ in range(3)]
        self.invariant = resolve_impl("attention", "batch_invariant", self.device).fn
        others = {i.name: i.fn for i in impls("attention") if not i.caps.batch_invariant and not i.caps.oracle
                  and self.device.type in i.devices and "float32" in i.dtypes and i.caps.max_len is None}
        self.other = others[fastest(others, lambda fn: (fn(*self.qkv, causal=True), sync(self.device)))]

    def track_batch_invariant_over_fastest(self, device):
        """Higher is dearer: 1.0 means invariance is free."""
        return alternating_ratio(lambda: self.invariant(*self.qkv, causal=True),
                                 lambda: self.other(*self.qkv, causal=True), device=self.device)

    track_batch_invariant_over_fastest.unit = "ratio"
