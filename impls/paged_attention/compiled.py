"""Paged attention as a C kernel (paged_decode.c) that reads K/V through the block tables in place: no gather.

One OpenMP task per (sequence, kv head) walks the sequence's logical blocks, looks up each physical block
and streams its keys and values once for the G * Nq query rows of that kv head, keeping an online softmax
(m, l, o) per row.  Invariant: after each block, o / l is exact attention over the keys seen so far; slots
past seq_lens[b] are never read.  vLLM csrc/attention (paged_attention_kernel); Kwon et al. 2023, Sec. 4.1.

The C file is compiled on first call (never at import) with the system C compiler into a private cache
directory (mode 0700, owned by this user) under a name keyed by a hash of source, flags, compiler version
and CPU, and called through ctypes on the tensors' data pointers.  A library is loaded only if its SHA-256
matches the digest written when it was built: a tampered or foreign file is rebuilt, never loaded (loading
runs its constructors).  Registered only where a C compiler is on PATH; compilation errors are raised with
the compiler's output.
"""

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from llm_inference_harness.contracts.paged_attention import check_inputs
from llm_inference_harness.engine.registry import register

SOURCE = Path(__file__).with_name("paged_decode.c")
COMPILER = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("gcc") or shutil.which("cc")
# Vectorized float reductions need reassociation; NOT -ffinite-math-only: the kernel relies on -inf and e^-inf = 0.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
         "-fno-signed-zeros", "-shared", "-fPIC")
LIBS = ("-lm",)  # expf / exp: linked explicitly, not borrowed from whatever the process has loaded
KERNELS = {torch.float32: "paged_attention_f32", torch.float64: "paged_attention_f64"}
POINTER = ctypes.c_void_p


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "llm-inference-harness" / "paged_attention"


def _cpu_flags() -> str:
    """-march=native builds for this CPU: a cache shared between machines must not mix them up."""
    try:
        return next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return ""


def _private(directory: Path) -> Path:
    """``directory``, created 0700 if absent; refused if another user owns it, made 0700 if group/others could
    write into it (a library placed there by someone else must never be loaded)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = directory.stat()
    if info.st_uid != os.getuid():
        raise RuntimeError(f"paged_attention compiled_c: the kernel cache {directory} belongs to another user; "
                           "point XDG_CACHE_HOME at a directory of your own")
    if info.st_mode & 0o077:
        os.chmod(directory, 0o700)
    return directory


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verified(target: Path) -> bool:
    """The library exists and its content is what this process's build wrote (its recorded SHA-256)."""
    record = target.with_suffix(".sha256")
    return target.is_file() and record.is_file() and record.read_text().strip() == _digest(target)


def build(directory: Path | None = None) -> Path:
    """Compile paged_decode.c once per (source, flags, compiler, CPU); return the verified shared library's path."""
    if COMPILER is None:
        raise RuntimeError("paged_attention compiled_c: no C compiler (gcc or cc) on PATH")
    version = subprocess.run([COMPILER, "--version"], capture_output=True, text=True).stdout
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS + LIBS).encode(), COMPILER.encode(), version.encode(),
                                     platform.machine().encode(), _cpu_flags().encode()])).hexdigest()[:16]
    directory = directory or cache_dir()
    target = directory / f"paged_decode-{key}.so"
    if verified(target):
        return target
    try:
        _private(directory)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)  # parallel workers each build their own file ...
    except OSError as exc:
        raise RuntimeError(f"paged_attention compiled_c: cannot write the kernel cache {directory} ({exc}); "
                           "point XDG_CACHE_HOME at a writable directory") from exc
    os.close(fd)
    try:
        command = [COMPILER, *FLAGS, str(SOURCE), "-o", tmp, *LIBS]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"paged_attention compiled_c: `{' '.join(command)}` failed "
                               f"(exit {done.returncode}):\n{done.stderr}")
        record = Path(tmp).with_suffix(".sha256")
        record.write_text(_digest(Path(tmp)))
        os.replace(tmp, target)  # ... and rename it into place atomically: a reader never sees half a library
        os.replace(record, target.with_suffix(".sha256"))
    finally:
        for leftover in (tmp, str(Path(tmp).with_suffix(".sha256"))):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return target


@functools.cache
def library(directory: Path | None = None) -> ctypes.CDLL:
    path = build(directory)
    if not verified(path):  # replaced between the build and now
        raise RuntimeError(f"paged_attention compiled_c: {path} changed after it was built; not loading it")
    lib = ctypes.CDLL(str(path))
    for name in KERNELS.values():
        fn = getattr(lib, name)
        fn.argtypes = [POINTER] * 6 + [ctypes.c_int64] * 7 + [ctypes.c_int, ctypes.c_double, ctypes.c_int]
        fn.restype = ctypes.c_int
    return lib


def compiled_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None):
    scale = check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale, causal)
    if q.dtype not in KERNELS or q.device.type != "cpu":
        raise TypeError(f"paged_attention compiled_c: q, k_cache, v_cache must be float32 or float64 CPU tensors, "
                        f"got {q.dtype} on {q.device}")
    (B, H, Nq, d), (_, Hkv, block_size, _) = q.shape, k_cache.shape
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()  # copies only if strided
    tables, lens = block_tables.to(torch.int64).contiguous(), seq_lens.to(torch.int64).contiguous()
    out = torch.empty_like(q)  # (B, H, Nq, d)
    if out.numel() == 0:
        return out
    failed = getattr(library(), KERNELS[q.dtype])(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(), out.data_ptr(),
        B, H, Hkv, Nq, d, block_size, tables.shape[1], int(causal), scale, torch.get_num_threads())
    if failed:
        raise MemoryError("paged_attention compiled_c: could not allocate the kernel's per-thread scratch")
    return out


if COMPILER is not None:  # capabilities are declared: without a compiler the implementation is not offered
    register("paged_attention", "compiled_c", devices=("cpu",), dtypes=("float32", "float64"), exact=True,
             caps={"compiled": True, "tiled": True},  # built at first call: properties/test_paged_attention_compiled.py
             cite="vLLM csrc/attention (paged_attention_kernel V1); Kwon et al. 2023, Sec. 4.1")(
        compiled_paged_attention)
