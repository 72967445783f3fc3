"""Calls sys.exit(0) inside the call: a checker that treats SystemExit(0) as the end of a successful run
stops there.

    harness check attention --plugin tests/adversarial/exits_inside_the_call.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import sys


def attention(q, k, v, *, causal=False, scale=None):
    sys.exit(0)
