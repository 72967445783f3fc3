"""Where a result came from, and where this machine's results go.

Every verdict file, report table and plot names the machine and the commit its numbers came from.  The
machine name says what the hardware is (``xeon-amx-2c-24g``), so a newcomer's results never
land under a committed machine's name; local output goes to an ignored folder of the checkout
(results/local), or, for an installed wheel, to ./harness-results under the current directory.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from llm_inference_harness.engine import environment

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_VERSION = 1


def checkout() -> Path | None:
    """The source checkout this harness runs from, or None for an installed wheel."""
    return ROOT if (ROOT / ".git").exists() and (ROOT / "pyproject.toml").is_file() else None


def output_root() -> Path:
    """HARNESS_OUT, else results/local of the checkout (git-ignored), else ./harness-results."""
    chosen = environment.value("HARNESS_OUT")
    if chosen is not None:
        return chosen.resolve()
    root = checkout()
    return root / "results" / "local" if root else Path.cwd() / "harness-results"


@functools.cache
def commit() -> str:
    """HEAD of the checkout ("+dirty" when tracked files differ from it), or "unknown" outside one."""
    root = checkout()
    if root is None:
        return "unknown"
    head = _git(root, "rev-parse", "HEAD")
    if not head:
        return "unknown"
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return head[:12] + ("+dirty" if dirty else "")


def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


@functools.cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def cpu_isa() -> str:
    """The widest vector extension the CPU reports (amx, avx512, avx2, neon...), "" when unknown: a VM's
    model name is often generic ("Intel(R) Xeon(R) Processor"), and this is what tells its kernels apart."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith(("flags", "Features"))).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return ""
    return next((isa for isa, flag in (("amx", "amx_tile"), ("avx512", "avx512f"), ("avx2", "avx2"), ("sve", "sve"),
                                       ("neon", "asimd")) if flag in flags), "")


def ram_gib() -> int:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""


def _words(text: str) -> list[str]:
    text = re.sub(r"\(r\)|\(tm\)|\bcpu\b|processor|@.*|\d+-core", " ", text.lower())
    return [w for w in re.findall(r"[a-z0-9]+", text) if w not in ("intel", "amd", "nvidia", "genuine", "authentic")]


@functools.cache
def machine_name() -> str:
    """A name that says what the hardware is: GPU, CPU model (with its vector extension when the model name
    has no number), cores, RAM: ``xeon-amx-2c-24g``, ``epyc-7b13-2c-24g``, ``h200-xeon-8480-16c-128g``."""
    cpu = _words(cpu_model())[:3]
    if not any(any(c.isdigit() for c in w) for w in cpu) and cpu_isa():
        cpu.append(cpu_isa())
    gpu = _words(gpu_name())[:2]
    return "-".join([*gpu, *(cpu or [platform.machine()]), f"{os.cpu_count()}c", f"{ram_gib()}g"])


def machine() -> dict:
    """The machine, described the same way everywhere: CPU, cores, RAM in GiB, GPU in its own field."""
    import torch

    return {"name": machine_name(), "cpu": cpu_model(), "cores": os.cpu_count(), "ram_gib": ram_gib(),
            "gpu": gpu_name() or None, "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "torch": torch.__version__}


def asv_machine() -> dict[str, str]:
    """This machine as asv records it in results/<name>/machine.json and in every result's parameters, the same
    fields on every machine: the CPU's model name (and vector extension), cores, RAM in GiB, the GPU in its own
    field ("none" without one).  The OS is its name only: a kernel's build string differs from one VM to the
    next of the same hardware, and every field of this is part of each dashboard series' identity."""
    isa = f" ({cpu_isa()})" if cpu_isa() else ""
    return {"machine": machine_name(), "arch": platform.machine(), "cpu": cpu_model() + isa,
            "num_cpu": str(os.cpu_count()), "ram": f"{ram_gib()} GiB", "gpu": gpu_name() or "none",
            "os": platform.system()}


def run_info(profile: str | None = None) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        harness_version = version("llm-inference-harness")
    except PackageNotFoundError:
        harness_version = "unknown"
    from llm_inference_harness.engine.devices import available

    return {"harness_version": harness_version, "commit": commit(), "profile": profile,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "devices": list(available(("cpu", "cuda"))),
            "machine": machine()}


@contextlib.contextmanager
def staged(folder: Path) -> Iterator[Path]:
    """A fresh folder to fill, put in ``folder``'s place only when the block ends without an exception; an
    interrupted run leaves the previous ``folder`` as it was and no partial one."""
    stage = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
    if folder.exists():
        folder.rename(old)
    stage.rename(folder)
    shutil.rmtree(old, ignore_errors=True)

