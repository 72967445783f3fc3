"""Computes the right answer, but leaves a thread running after its first call that keeps zeroing the tensors it
was handed, hoping to reach the judge's own copies of the next inputs.

    harness check attention --plugin tests/adversarial/lingering_thread.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import threading
import time

from wrong_attention import correct

_held = []


def _spoil():
    while True:
        for t in list(_held):
            t.zero_()
        time.sleep(0.001)


def attention(q, k, v, *, causal=False, scale=None):
    out = correct(q, k, v, causal=causal, scale=scale)
    if not _held:
        threading.Thread(target=_spoil, daemon=True).start()
    _held[:] = [q, k, v]
    return out
