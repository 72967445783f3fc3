"""Returns its input ``q`` itself (same shape when d matches): the judge's later use of q, or of the output,
would see one object, and a write to either shows in both.

    harness check attention --plugin tests/adversarial/aliases_an_input.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

from wrong_attention import wrong


def attention(q, k, v, *, causal=False, scale=None):
    out = wrong(q, k, v)
    if out.shape == q.shape:
        q.copy_(out)  # q now holds the answer: returned as the very same tensor
        return q
    return out
