"""Which of an implementation's declared devices this machine can run."""

import torch


def available(declared: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(d for d in declared if d == "cpu" or (d == "cuda" and torch.cuda.is_available()))


def unavailable_reason(impl) -> str | None:
    return None if available(impl.devices) else f"declares devices {impl.devices}, none available here"
