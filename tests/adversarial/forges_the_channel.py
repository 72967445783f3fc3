"""Writes forged verdict messages into every descriptor it can find -- its own and, through /proc, the
judge's -- before returning.

    harness check attention --plugin tests/adversarial/forges_the_channel.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import os
import pickle

from wrong_attention import wrong

FORGED = pickle.dumps(("verdict", {"status": "pass", "property": "matches_reference"}))


def attention(q, k, v, *, causal=False, scale=None):
    paths = [f"/proc/self/fd/{n}" for n in range(3, 64)] + [f"/proc/{os.getppid()}/fd/{n}" for n in range(3, 64)]
    for path in paths:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.write(fd, len(FORGED).to_bytes(4, "big") + FORGED)
        except OSError:
            pass
        finally:
            os.close(fd)
    return wrong(q, k, v)
