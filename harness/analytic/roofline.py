"""A roofline estimator: FLOPs and bytes of each kernel of standard vs flash attention, and the
time each needs on a device that can do F FLOP/s and move W bytes/s:  t >= max(FLOPs/F, bytes/W).

A kernel whose arithmetic intensity (FLOPs per byte) is below the device's balance point F/W is
memory bound.  Standard attention's bytes are the IO model's 4N^2 + 4Nd elements split over its
three kernels; flash attention's are the FA-2 count (harness/analytic/iomodel.py).  Williams, Waterman &
Patterson 2009, "Roofline"; Dao et al. 2022, Sec. 2 and 3.2.

    python -m llm_inference_harness.analytic.roofline   # the table for N=4096, d=128, fp16, and a measured CPU entry
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from llm_inference_harness.analytic.iomodel import fa2_traffic


@dataclass(frozen=True)
class Device:
    name: str
    flops: float  # peak FLOP/s: dense fp16 tensor cores on GPUs, fp32 matmul measured on the CPU
    bandwidth: float  # bytes/s of main memory (HBM / DRAM)
    source: str

    @property
    def balance(self) -> float:
        """FLOP per byte at which compute and memory time are equal."""
        return self.flops / self.bandwidth


# Datasheet values (dense, i.e. without 2:4 sparsity, which the datasheets' headline figures double):
#   NVIDIA A100 Tensor Core GPU datasheet (2021): FP16 tensor 312 TFLOPS; HBM2e 2,039 GB/s (80GB SXM),
#     HBM2 1,555 GB/s (40GB).
#   NVIDIA H100 Tensor Core GPU datasheet (2023): H100 SXM FP16 tensor 1,979 TFLOPS with sparsity
#     (989.5 dense); HBM3 3.35 TB/s.
#   NVIDIA H200 Tensor Core GPU datasheet (2024): H200 SXM FP16 tensor 1,979 TFLOPS with sparsity
#     (989.5 dense); HBM3e 4.8 TB/s.
DEVICES = {
    d.name: d
    for d in (
        Device("A100-SXM4-80GB", 312e12, 2039e9, "NVIDIA A100 datasheet"),
        Device("A100-40GB", 312e12, 1555e9, "NVIDIA A100 datasheet"),
        Device("H100-SXM5", 989.5e12, 3.35e12, "NVIDIA H100 datasheet"),
        Device("H200-SXM", 989.5e12, 4.8e12, "NVIDIA H200 datasheet"),
    )
}


def measure_cpu(n: int = 1024, copy_mb: int = 64, repeats: int = 5) -> Device:
    """This machine's ceilings, measured: best fp32 matmul FLOP/s and best copy bandwidth
    (a copy reads and writes every byte, so it moves 2x its size)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    src = torch.empty(copy_mb * 2**20 // 4)
    dst = torch.empty_like(src)
    a @ b, dst.copy_(src)  # warm up: first calls pay for allocation and thread start
    t_mm = min(_seconds(lambda: a @ b) for _ in range(repeats))
    t_copy = min(_seconds(lambda: dst.copy_(src)) for _ in range(repeats))
    return Device("cpu (measured)", 2 * n**3 / t_mm, 2 * src.numel() * 4 / t_copy,
                  f"llm_inference_harness.analytic.roofline.measure_cpu on this machine, "
                  f"{torch.get_num_threads()} threads")


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@dataclass(frozen=True)
class Kernel:
    name: str
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    def seconds(self, device: Device) -> float:
        return max(self.flops / device.flops, self.bytes / device.bandwidth)

    def bound(self, device: Device) -> str:
        return "compute" if self.intensity > device.balance else "memory"


SOFTMAX_FLOPS = 5  # per score: max, subtract, exp, sum, divide


def standard_kernels(N: int, d: int, itemsize: int = 2) -> list[Kernel]:
    """Algorithm 0 as three kernels; their bytes add up to (4N^2 + 4Nd) * itemsize."""
    return [
        Kernel("S = QK^T", 2 * N * N * d, (2 * N * d + N * N) * itemsize),
        Kernel("P = softmax(S)", SOFTMAX_FLOPS * N * N, 2 * N * N * itemsize),
        Kernel("O = PV", 2 * N * N * d, (N * N + 2 * N * d) * itemsize),
    ]


def flash_kernels(N: int, d: int, Br: int = 128, itemsize: int = 2) -> list[Kernel]:
    """One fused kernel: all the FLOPs, and FA-2's traffic."""
    flops = 4 * N * N * d + SOFTMAX_FLOPS * N * N
    return [Kernel(f"flash (FA-2, Br={Br})", flops, fa2_traffic(N, N, d, Br) * itemsize)]


def decode_seconds_per_token(params: float, itemsize: int, device: Device) -> float:
    """Batch-1 decoding reads every weight once per token: a lower bound of weights bytes / bandwidth."""
    return params * itemsize / device.bandwidth


def table(N: int = 4096, d: int = 128, itemsize: int = 2, devices: list[Device] | None = None) -> str:
    devices = devices or list(DEVICES.values())
    rows = [f"attention N={N} d={d}, {itemsize}-byte elements"]
    rows.append(f"{'kernel':24s} {'GFLOP':>8s} {'MB':>8s} {'FLOP/B':>7s}" + "".join(f" {x.name:>16s}" for x in devices))
    for name, ks in (("standard", standard_kernels(N, d, itemsize)), ("flash", flash_kernels(N, d, itemsize=itemsize))):
        for k in ks:
            rows.append(f"{k.name:24s} {k.flops / 1e9:8.2f} {k.bytes / 1e6:8.2f} {k.intensity:7.1f}" + "".join(
                f" {k.seconds(x) * 1e6:9.1f}us {k.bound(x)[:3]}" for x in devices))
        total = sum(k.seconds(x) for k in ks for x in devices[:1])
        rows.append(f"  {name} total on {devices[0].name}: {total * 1e6:.1f} us")
    rows.append("balance points (FLOP/B): " + ", ".join(f"{x.name} {x.balance:.0f}" for x in devices))
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(devices=[*DEVICES.values(), measure_cpu()]))
