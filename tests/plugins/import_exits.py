"""A plugin module that ends its process while being imported."""

import os

os._exit(7)


def attention(q, k, v, *, causal=False, scale=None):
    return q
