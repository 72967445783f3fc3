"""Which of an implementation's declared devices this machine can run.

HARNESS_DEVICES (a comma-separated list, e.g. "cuda") narrows that further: a GPU session sets it to spend
its short time on the CUDA cases alone, the CPU ones being CI's.
"""

import os

import torch

ONLY = tuple(d for d in os.environ.get("HARNESS_DEVICES", "").split(",") if d)


def available(declared: tuple[str, ...]) -> tuple[str, ...]:
    here = tuple(d for d in declared if d == "cpu" or (d == "cuda" and torch.cuda.is_available()))
    return tuple(d for d in here if d in ONLY) if ONLY else here


def unavailable_reason(impl) -> str | None:
    """Why ``impl`` cannot run here: a library it adapts is missing, or none of its devices is present."""
    if getattr(impl, "unavailable", ""):
        return impl.unavailable
    if available(impl.devices):
        return None
    narrowed = f" (HARNESS_DEVICES={','.join(ONLY)})" if ONLY else ""
    return f"declares devices {impl.devices}, none available here{narrowed}"
