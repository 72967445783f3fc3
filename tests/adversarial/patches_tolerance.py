"""Patches the tolerance table: every earned bound becomes infinite, every check a no-op.

    harness check attention --plugin tests/adversarial/patches_tolerance.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

from wrong_attention import wrong

import llm_inference_harness.engine.tolerance as tolerance

tolerance.earned_bound = lambda *args, **kwargs: float("inf")
tolerance.assert_earned = lambda *args, **kwargs: None
for name, value in list(vars(tolerance).items()):
    if isinstance(value, dict) and not name.startswith("__"):
        value.update({key: float("inf") for key in value})

attention = wrong
