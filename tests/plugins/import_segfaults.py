"""A plugin module that dereferences a null pointer while being imported."""

import ctypes

ctypes.string_at(0)


def attention(q, k, v, *, causal=False, scale=None):
    return q
