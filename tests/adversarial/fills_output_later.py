"""Returns zeros at once and fills in the answer from a thread a moment later, hoping the judge reads the
output after the thread has written it.

    harness check attention --plugin tests/adversarial/fills_output_later.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import threading
import time

import torch
from wrong_attention import correct


def attention(q, k, v, *, causal=False, scale=None):
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    q, k, v = q.clone(), k.clone(), v.clone()
    threading.Thread(target=lambda: (time.sleep(0.01), out.copy_(correct(q, k, v, causal=causal, scale=scale))),
                     daemon=True).start()
    return out
