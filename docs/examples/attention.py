"""Exact attention, plainly: a plugin for the attention contract (harness/contracts/attention.py).

    harness check attention --plugin docs/examples/attention.py:attention
"""

import torch

from llm_inference_harness import declare
from llm_inference_harness.contracts.attention import check_inputs, check_scores_budget


@declare(dtypes=("float32", "float64"), devices=("cpu",))
def attention(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)  # ValueError/TypeError naming the argument on bad input
    check_scores_budget("my attention", q, k.shape[2], copies=2)  # refuse, before allocating, scores past the budget
    B, H, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, Nk, d): query head h reads kv head h // (H // Hkv)
    v = v.repeat_interleave(H // Hkv, dim=1)  # (B, H, Nk, d)
    s = q @ k.transpose(-1, -2) * scale  # (B, H, Nq, Nk)
    i, j = torch.arange(Nq)[:, None], torch.arange(Nk)[None, :]
    visible = j <= i + Nk - Nq if causal else torch.ones(Nq, Nk, dtype=torch.bool)  # bottom-right alignment
    p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)  # (B, H, Nq, Nk)
    p = torch.where(visible.any(dim=-1, keepdim=True), p, 0)  # a row that sees no key -> 0 (a NaN input stays NaN)
    return p @ v  # (B, H, Nq, d)
