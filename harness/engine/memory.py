"""Peak bytes of the tensors a call allocates, on any device (CPU has no allocator statistics).

`TensorMemory` is a TorchDispatchMode: every aten op's output whose storage is new (not an input's,
not already tracked) counts as an allocation of its storage's size, released when the last Python
tensor on that storage dies.  This sees every tensor the call materializes -- the (Nq, Nk) score
matrix of a naive backward is one of them -- but not allocator slack or a kernel's private workspace;
on CUDA, `torch.cuda.max_memory_allocated` measures the same thing from the allocator.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# The meters entered in this context: a call in the implementation's process (harness/engine/boundary.py) is
# measured there by a meter of its own, and its peak and largest allocation are added to these.
METERS: contextvars.ContextVar[tuple] = contextvars.ContextVar("tensor_memory", default=())
HEADROOM: contextvars.ContextVar[int | None] = contextvars.ContextVar("address_space_headroom", default=None)


class TensorMemory(TorchDispatchMode):
    """``with TensorMemory() as mem: f()`` -> mem.peak (bytes live at once), mem.largest (one allocation)."""

    def __enter__(self):
        self._token = METERS.set((*METERS.get(), self))
        return super().__enter__()

    def __exit__(self, *exc):
        METERS.reset(self._token)
        return super().__exit__(*exc)

    def add_remote(self, peak: int, largest: int) -> None:
        """A call measured in the implementation's process, while this meter was on."""
        self.peak, self.largest = max(self.peak, self.live + peak), max(self.largest, largest)

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = self.largest = 0
        self._storages: dict[int, list[int]] = {}  # storage data_ptr -> [nbytes, live tensors on it]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors_in = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        inputs = {t.untyped_storage().data_ptr() for t in tensors_in}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self._storages:
                if ptr in inputs or ptr == 0:  # a view or in-place result of memory we did not see allocated
                    continue
                nbytes = t.untyped_storage().nbytes()
                self._storages[ptr] = [nbytes, 0]
                self.live += nbytes
                self.peak, self.largest = max(self.peak, self.live), max(self.largest, nbytes)
            self._storages[ptr][1] += 1
            weakref.finalize(t, self._release, ptr)
        return out

    def _release(self, ptr: int) -> None:
        entry = self._storages[ptr]
        entry[1] -= 1
        if entry[1] == 0:
            self.live -= entry[0]
            del self._storages[ptr]


@contextlib.contextmanager
def address_space_headroom(nbytes: int) -> Iterator[None]:
    """Cap this process's address space at what it maps now plus ``nbytes`` (Linux), for a call that must
    refuse an oversized input rather than allocate it: an allocation past the cap fails at once with a
    MemoryError/RuntimeError instead of paging the machine to death.  Without /proc or RLIMIT_AS: no cap."""
    try:
        import resource

        mapped = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                      if line.startswith("VmSize:"))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, StopIteration, ValueError):
        yield
        return
    cap = mapped + nbytes
    if soft != resource.RLIM_INFINITY:
        cap = min(cap, soft)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    token = HEADROOM.set(nbytes)  # a call in the implementation's process gets the same headroom there
    try:
        yield
    finally:
        HEADROOM.reset(token)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
