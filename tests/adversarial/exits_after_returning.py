"""Returns the right answer, then ends its process from a timer thread with exit code 0 (an implementation that
takes its caller down): a harness that reads "exited 0" as success would record a pass.

    harness check attention --plugin tests/adversarial/exits_after_returning.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import os
import threading

from wrong_attention import correct


def attention(q, k, v, *, causal=False, scale=None):
    threading.Timer(0.05, lambda: os._exit(0)).start()
    return correct(q, k, v, causal=causal, scale=scale)
