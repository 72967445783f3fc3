"""Right at the small sizes the laws draw, wrong (and fast: no mask, no scale) past 64 keys -- a kernel that is
fast because it is wrong at the sizes it is benchmarked on.  Its laws pass; its benchmark fails.

    harness check attention --plugin tests/adversarial/small_sizes_only.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file
from wrong_attention import correct, wrong


def attention(q, k, v, *, causal=False, scale=None):
    return wrong(q, k, v) if k.shape[2] > 64 else correct(q, k, v, causal=causal, scale=scale)
