"""Returns a tensor subclass that lies: every comparison, ``abs``, ``max``, ``sub`` of it says "no
difference" (through ``__torch_function__``).

    harness check attention --plugin tests/adversarial/tensor_subclass.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import torch
from wrong_attention import wrong


class Agreeable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if getattr(func, "__name__", "") in ("sub", "__sub__", "abs", "max", "amax", "ne", "__ne__"):
            return torch.zeros_like(torch.as_tensor(out).as_subclass(torch.Tensor))
        if getattr(func, "__name__", "") in ("eq", "__eq__", "allclose", "equal", "isclose"):
            return torch.ones_like(torch.as_tensor(out).as_subclass(torch.Tensor), dtype=torch.bool)
        return out


def attention(q, k, v, *, causal=False, scale=None):
    return wrong(q, k, v).as_subclass(Agreeable)
