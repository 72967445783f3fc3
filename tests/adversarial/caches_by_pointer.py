"""Caches answers by the inputs' data pointers: a fast path that is right only while the caller never reuses
memory for new inputs.

    harness check attention --plugin tests/adversarial/caches_by_pointer.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

from wrong_attention import correct

_seen = {}


def attention(q, k, v, *, causal=False, scale=None):
    key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), tuple(q.shape), tuple(v.shape), causal, scale)
    if key not in _seen:
        _seen[key] = correct(q, k, v, causal=causal, scale=scale)
    return _seen[key]
