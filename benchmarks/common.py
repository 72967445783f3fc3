"""Shared by the asv benchmark files: device resolution and CUDA-synchronized timing.

Benchmark files import only this and the harness; building tensors happens in ``setup`` (asv's
forkserver deadlocks children when torch computes at import time).
"""

import copy
import statistics
import time
from collections.abc import Mapping

import torch

DEVICES = ["cpu", "cuda"]  # the same grid on every machine; cuda raises NotImplementedError where absent
# The FlashAttention-2 paper's kernel benchmark (Dao 2023, Sec. 4.1): batch x N = 16k tokens, H x d = 2048.
KERNEL_LENGTHS = [1024, 4096, 16384]
KERNEL_HEAD_DIMS = [64, 128]


def paper_shape(N: int, d: int) -> tuple[int, int, int, int]:
    return 16384 // N, 2048 // d, N, d  # (B, H, N, d)


def resolve_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise NotImplementedError("no CUDA device on this machine")
    return torch.device(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class _MappingCaps:
    """An older commit's capabilities -- a mapping, before each contract declared a typed Caps -- read as
    attributes (undeclared ones are None), so the benchmarks run over the project's whole history."""

    def __init__(self, caps: Mapping) -> None:
        self._caps = dict(caps)

    def __getattr__(self, name: str):
        return self._caps.get(name)


def _typed(impl):
    if isinstance(getattr(impl, "caps", None), Mapping):
        impl = copy.copy(impl)
        object.__setattr__(impl, "caps", _MappingCaps(impl.caps))
    return impl


def registered(technique: str) -> list:
    """Every registered non-mutant implementation (plugins included), capabilities read as attributes."""
    try:
        from llm_inference_harness.engine.registry import impls
    except ImportError:  # an older commit without the harness: asv skips, nothing crashes
        return []
    return [_typed(i) for i in impls(technique)]


def impl_names(technique: str) -> list[str]:
    """Every registered implementation's name: the benchmark grid follows the registry."""
    return [i.name for i in registered(technique)]


def resolve_impl(technique: str, name: str, device: torch.device, dtype: str = "float32"):
    """The implementation's function, or NotImplementedError (asv prints n/a) if it cannot run here."""
    from llm_inference_harness.engine.registry import REGISTRY, load_all

    load_all()
    impl = REGISTRY.get((technique, name))
    if impl is None:
        raise NotImplementedError(f"{name} is not registered at this commit")
    if getattr(impl, "unavailable", None):  # an adapter of a missing library (older commits have no such field)
        raise NotImplementedError(impl.unavailable)
    if device.type not in impl.devices or dtype not in impl.dtypes:
        raise NotImplementedError(f"{name} declares devices {impl.devices} and dtypes {impl.dtypes}")
    if type(impl.fn).__name__ == "Elsewhere":  # another distribution's: timed from here, run in its own process
        from llm_inference_harness.engine.runner import Target, open_isolated

        impl = open_isolated(Target(technique, name=name), one_thread=torch.get_num_threads() == 1)
    return _typed(impl)


SPOT_ROWS = 64  # query rows of a benchmark-sized output compared with the float64 reference


def checked_at_scale(fn, q, k, v, *, causal: bool):
    """``fn(q, k, v)`` once at the benchmark's own size, ``SPOT_ROWS`` of its query rows (drawn with a fixed seed)
    compared with the float64 reference within the earned bound: a kernel that is fast because it is wrong at
    large sizes fails its benchmark (asv: failed) instead of getting a number.  Returns the output."""
    from llm_inference_harness.engine.tolerance import assert_earned
    from llm_inference_harness.references.attention import attention_rows

    out = fn(q, k, v, causal=causal)
    rows = torch.randperm(q.shape[2], generator=torch.Generator().manual_seed(0))[:SPOT_ROWS].sort().values
    truth, plain = attention_rows(q, k, v, rows, causal=causal)
    assert_earned(out[:, :, rows].cpu(), truth, [plain], q.dtype, what=f"at benchmark size {tuple(q.shape)}")
    return out


def require(*modules: str) -> None:
    """Raise NotImplementedError (asv: skipped) when a commit predates one of the harness modules a file needs.

    asv benchmarks every commit with *this* benchmark suite, so a file's module-level ``setup`` calls this
    and older commits show n/a instead of a crash.
    """
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise NotImplementedError(f"{name} is not available at this commit ({exc})") from None


def cuda_warm_up(device: torch.device, fn) -> None:
    """On CUDA, one untimed call of fn() in setup: asv --quick times a single call, which would otherwise
    include a Triton kernel's JIT compile, cuBLAS's handle and the caching allocator's first blocks."""
    if device.type == "cuda":
        fn()
        torch.cuda.synchronize()


def cuda_seconds(fn, calls: int = 10) -> float:
    """Median GPU seconds of fn() over ``calls`` calls, each between two CUDA events, after one warm-up call
    (which also compiles a Triton kernel on first use)."""
    cuda_warm_up(torch.device("cuda"), fn)
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def median_seconds(fn, repeat: int = 3) -> float:
    """Median wall time of fn() over ``repeat`` calls (for ratios measured within one run)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
