"""Kills its parent, the judge, with SIGKILL: a harness that reads a dead judge as "nothing failed" would
pass it.

    harness check attention --plugin tests/adversarial/kills_the_judge.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import os
import signal

from wrong_attention import wrong


def attention(q, k, v, *, causal=False, scale=None):
    try:
        os.kill(os.getppid(), signal.SIGKILL)
    except OSError:
        pass
    return wrong(q, k, v)
