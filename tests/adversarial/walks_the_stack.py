"""Walks the call stack looking for the judge's expected answer (a float64 tensor of the output's shape in
some caller's locals) and returns it; the wrong answer when it finds none.

    harness check attention --plugin tests/adversarial/walks_the_stack.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import sys

import torch
from wrong_attention import wrong


def attention(q, k, v, *, causal=False, scale=None):
    frame, shape = sys._getframe(1), (*q.shape[:3], v.shape[-1])
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, torch.Tensor) and value.dtype == torch.float64 and tuple(value.shape) == shape:
                return value.to(q.dtype)
        frame = frame.f_back
    return wrong(q, k, v)
