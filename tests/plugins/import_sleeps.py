"""A plugin module that never finishes importing."""

import time

time.sleep(3600)


def attention(q, k, v, *, causal=False, scale=None):
    return q
