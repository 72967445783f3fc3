"""Zeroes its inputs in place after computing: a judge that computes its reference from the same tensors
afterwards would compare against attention of zeros.

    harness check attention --plugin tests/adversarial/mutates_inputs.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

from wrong_attention import wrong


def attention(q, k, v, *, causal=False, scale=None):
    out = wrong(q, k, v)
    for t in (q, k, v):
        t.zero_()
    return out
