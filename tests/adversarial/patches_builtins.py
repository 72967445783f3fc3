"""Patches builtins: ``abs`` and ``max`` return 0, AssertionError is swallowed by being made a harmless
class.

    harness check attention --plugin tests/adversarial/patches_builtins.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import builtins

from wrong_attention import wrong

builtins.abs = lambda x: 0
builtins.max = lambda *args, **kwargs: 0
builtins.AssertionError = type("AssertionError", (Warning,), {})

attention = wrong
