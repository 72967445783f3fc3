"""Naive three-pass attention: S = q k^T, P = safe softmax(S), O = P v.

Materializes the (Nq, Nk) score matrix -- the standard attention whose HBM traffic FlashAttention
avoids.  Invariant: the row max is subtracted before exp (safe softmax), so large logits do not
overflow.  In the input dtype, except that half-precision inputs carry S and P in float32 (the
contract's score_dtype: a float16 q k^T overflows past 65504), P rounded back before P v.
Dao et al. 2022, "FlashAttention", Algorithm 0.
"""

import torch

from llm_inference_harness.contracts.attention import (
    causal_allowed,
    check_inputs,
    check_scores_budget,
    no_work_output,
    score_dtype,
)
from llm_inference_harness.engine.registry import register


@register("attention", "naive", devices=("cpu", "cuda"), cite="Dao et al. 2022, Algorithm 0")
def naive_attention(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    if (empty := no_work_output(q, Nk)) is not None:  # no keys: amax over an empty dim raises
        return empty
    check_scores_budget("attention naive", q, Nk, copies=2)  # S and P live at once
    wide = score_dtype(q.dtype)
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d).to(wide)  # (B, Hkv, G, Nq, d)
    s = qg @ k.to(wide)[:, :, None].transpose(-1, -2) * scale  # pass 1: (B, Hkv, G, Nq, Nk)
    if causal:
        s = s.masked_fill(~causal_allowed(Nq, Nk, device=q.device), float("-inf"))
    m = s.amax(dim=-1, keepdim=True)  # pass 2: safe softmax
    p = torch.exp(s - torch.where(torch.isfinite(m), m, 0))
    l = p.sum(dim=-1, keepdim=True)  # noqa: E741
    p = (p / torch.where(l > 0, l, 1)).to(q.dtype)
    return (p @ v[:, :, None]).reshape(B, H, Nq, d)  # pass 3: (B, H, Nq, d)
