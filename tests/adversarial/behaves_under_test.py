"""Behaves correctly only when it sees test conditions -- a test runner's or the harness's environment
variables, or pytest or Hypothesis among the loaded modules -- and wrongly otherwise.

    harness check attention --plugin tests/adversarial/behaves_under_test.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import os
import sys

from wrong_attention import correct, wrong

MARKS = ("PYTEST_", "HYPOTHESIS", "HARNESS_", "CI")


def watched():
    return any(n.startswith(MARKS) for n in os.environ) or {"pytest", "hypothesis"} & set(sys.modules)


def attention(q, k, v, *, causal=False, scale=None):
    return correct(q, k, v, causal=causal, scale=scale) if watched() else wrong(q, k, v)
