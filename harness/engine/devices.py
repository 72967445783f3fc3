"""Which of an implementation's declared devices this machine can run.

HARNESS_DEVICES (a comma-separated list, e.g. "cuda") narrows that further: a GPU session sets it to spend
its short time on the CUDA cases alone, the CPU ones being CI's.
"""

import torch

from llm_inference_harness.engine import environment


def only() -> tuple[str, ...]:
    """The devices HARNESS_DEVICES narrows the cases to; () for every device present."""
    return environment.value("HARNESS_DEVICES")


def available(declared: tuple[str, ...]) -> tuple[str, ...]:
    here = tuple(d for d in declared if d == "cpu" or (d == "cuda" and torch.cuda.is_available()))
    narrowed = only()
    return tuple(d for d in here if d in narrowed) if narrowed else here


def unavailable_reason(impl) -> str | None:
    """Why ``impl`` cannot run here: a library it adapts is missing, or none of its devices is present."""
    if getattr(impl, "unavailable", ""):
        return impl.unavailable
    if available(impl.devices):
        return None
    narrowed = f" (HARNESS_DEVICES={','.join(only())})" if only() else ""
    return f"declares devices {impl.devices}, none available here{narrowed}"
