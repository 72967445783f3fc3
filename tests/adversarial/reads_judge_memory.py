"""Reads the judge's memory through /proc/<parent>/mem, looking for float64 arrays to copy; returns the wrong
answer when it cannot.

    harness check attention --plugin tests/adversarial/reads_judge_memory.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import os

from wrong_attention import wrong


def attention(q, k, v, *, causal=False, scale=None):
    try:
        with open(f"/proc/{os.getppid()}/mem", "rb") as mem:
            mem.read(1)
    except OSError:
        pass
    return wrong(q, k, v)
