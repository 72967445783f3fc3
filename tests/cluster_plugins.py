"""Plugins for the Ray executor's tests (tests/test_cluster.py)."""

import os
import signal

from llm_inference_harness.impls.attention.naive import naive_attention


def kills_its_checker(q, k, v, *, causal=False, scale=None):
    """Ends the process that started its checking process (this process's parent): on a Ray node, the worker
    running its unit.  (Checked locally, that process is the harness itself: no verdict would be written.)"""
    checker = os.getppid()
    with open(f"/proc/{checker}/stat") as stat:
        worker = int(stat.read().rsplit(")", 1)[1].split()[1])
    os.kill(worker, signal.SIGKILL)
    return naive_attention(q, k, v, causal=causal, scale=scale)


def slow_correct(q, k, v, *, causal=False, scale=None):
    """Correct, a tenth of a second a call: units that keep a node busy while it is removed."""
    import time

    time.sleep(0.1)
    return naive_attention(q, k, v, causal=causal, scale=scale)
