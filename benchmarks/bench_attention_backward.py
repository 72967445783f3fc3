"""Attention backward: forward+backward time vs N, and the peak memory of the backward alone.

Every backward gets (o, L) from the same FlashAttention-2 forward (fa2_lse_64x64, which returns L),
so time differences between implementations are differences of their backwards.  Peak memory: on
CUDA the allocator's max_memory_allocated over the call; on CPU (no allocator statistics) the peak
of live tensor bytes allocated by the call's aten ops (llm_inference_harness.engine.memory.TensorMemory), which counts
every materialized (Nq, Nk) matrix.  B=1, H=8, d=64, fp32, not causal; the oracle is left out.
On CUDA, KernelTflops sets the Triton backward against SDPA's at the forward's KernelTflops shapes.
"""

import torch

from benchmarks.common import (
    DEVICES,
    KERNEL_HEAD_DIMS,
    KERNEL_LENGTHS,
    cuda_seconds,
    cuda_warm_up,
    impl_names,
    paper_shape,
    require,
    resolve_device,
    resolve_impl,
    sync,
)


def setup(*params):
    """asv runs this before every benchmark here: older commits without these modules are skipped."""
    require("llm_inference_harness.contracts.attention_backward", "llm_inference_harness.engine.memory")


IMPLS = [n for n in impl_names("attention_backward") if n != "reference"]
LENGTHS = [128, 512, 2048, 4096]
CPU_MAX_LEN = 2048  # at 4096 the naive backward holds 2.5 GiB of (8, N, N) fp32 matrices; tile loops take minutes


class AttentionBackward:
    params = [IMPLS, DEVICES, LENGTHS]
    param_names = ["impl", "device", "N"]
    timeout = 600

    def setup(self, impl, device, N):
        self.device = resolve_device(device)
        if self.device.type == "cpu" and N > CPU_MAX_LEN:
            raise NotImplementedError(f"N={N} is not affordable on CPU (limit {CPU_MAX_LEN})")
        self.backward = resolve_impl("attention_backward", impl, self.device).fn
        self.forward = resolve_impl("attention", "fa2_lse_64x64", self.device).fn
        g = torch.Generator().manual_seed(0)
        self.q, self.k, self.v, self.do = (torch.randn(1, 8, N, 64, generator=g).to(self.device) for _ in range(4))
        self.o, self.lse = self.forward(self.q, self.k, self.v, return_lse=True)
        cuda_warm_up(self.device, lambda: self.time_forward_backward(impl, device, N))

    def time_forward_backward(self, impl, device, N):
        o, lse = self.forward(self.q, self.k, self.v, return_lse=True)
        self.backward(self.q, self.k, self.v, o, lse, self.do)
        sync(self.device)

    def track_backward_peak_memory(self, impl, device, N):
        """Peak bytes allocated by one backward call beyond its inputs (lower is better)."""
        args = (self.q, self.k, self.v, self.o, self.lse, self.do)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            grads = self.backward(*args)
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - before
        from llm_inference_harness.engine.memory import TensorMemory

        with TensorMemory() as mem:
            grads = self.backward(*args)
        del grads
        return mem.peak

    track_backward_peak_memory.unit = "bytes"


class KernelTflops:
    """Backward TFLOP/s in bfloat16 at the FlashAttention-2 paper's shapes, counting 2.5x the forward's FLOPs
    (five matmuls to its two; Dao 2023, Sec. 4.1): triton_fa2's recomputing backward, given (o, L) from the
    Triton forward, against SDPA's backward (autograd through the registered sdpa).  CUDA only."""

    params = [["triton_fa2", "sdpa"], ["cuda"], KERNEL_LENGTHS, KERNEL_HEAD_DIMS, [False, True]]
    param_names = ["impl", "device", "N", "d", "causal"]
    timeout = 120

    def setup(self, impl, device, N, d, causal):
        self.device = resolve_device(device)
        B, H, N, d = paper_shape(N, d)
        g = torch.Generator(self.device).manual_seed(0)
        q, k, v, do = (torch.randn(B, H, N, d, generator=g, device=self.device, dtype=torch.bfloat16)
                       for _ in range(4))
        self.flops = 2.5 * 4 * B * H * N * N * d * (0.5 if causal else 1.0)
        if impl == "sdpa":
            qkv = [t.requires_grad_() for t in (q, k, v)]
            o = resolve_impl("attention", "sdpa", self.device, "bfloat16").fn(*qkv, causal=causal)
            self.call = lambda: torch.autograd.grad(o, qkv, do, retain_graph=True)
        else:
            backward = resolve_impl("attention_backward", impl, self.device, "bfloat16").fn
            forward = resolve_impl("attention", impl, self.device, "bfloat16").fn
            o, lse = forward(q, k, v, causal=causal, return_lse=True)
            self.call = lambda: backward(q, k, v, o, lse, do, causal=causal)

    def track_tflops(self, impl, device, N, d, causal):
        return self.flops / cuda_seconds(self.call) / 1e12

    track_tflops.unit = "TFLOP/s"
