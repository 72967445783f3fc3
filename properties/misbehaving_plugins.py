"""Attention plugins that break the contract in the ways the guard must report, one per function, and one
that keeps it (properties/test_plugin_verdicts.py checks each gets its own verdict and the run goes on)."""

import os
import time

import torch

from harness.plugins import declare
from impls.attention.naive import naive_attention


def correct(q, k, v, *, causal=False, scale=None):
    return naive_attention(q, k, v, causal=causal, scale=scale)


def raises(q, k, v, *, causal=False, scale=None):
    raise RuntimeError("boom")


@declare(caps={"call_limit_s": 1})
def hangs(q, k, v, *, causal=False, scale=None):
    time.sleep(3600)


def nan(q, k, v, *, causal=False, scale=None):
    return torch.full_like(q, float("nan"))


def zeros(q, k, v, *, causal=False, scale=None):
    return torch.zeros_like(q)


def wrong_shape(q, k, v, *, causal=False, scale=None):
    return naive_attention(q, k, v, causal=causal, scale=scale)[..., :1]


def mutates(q, k, v, *, causal=False, scale=None):
    out = naive_attention(q, k, v, causal=causal, scale=scale)
    k.mul_(2)
    return out


def crashes(q, k, v, *, causal=False, scale=None):
    os._exit(3)
