"""Registers an atexit handler that prints passing verdict lines and exits 0, for a harness that parses its
children's output.

    harness check attention --plugin tests/adversarial/exits_at_exit.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import atexit
import os

from wrong_attention import wrong


def _forge():
    print("pass exits_at_exit / matches_reference", flush=True)
    os._exit(0)


atexit.register(_forge)
attention = wrong
