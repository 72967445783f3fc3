"""Standard attention backward: materialize S, P, dP and dS, each (Nq, Nk), then five matmuls.

The baseline whose O(N^2) memory the FlashAttention backward avoids.  Invariant: P is recomputed from
the stored L as exp(S - L) (rows that see no key: every S is -inf and P = 0), and
dS = P o (dP - D) with D_i = dO_i . O_i.  Dao et al. 2022, "FlashAttention", Algorithm 3 (standard backward).
"""

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_scores_budget
from llm_inference_harness.contracts.attention_backward import check_backward_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.numerics.online_softmax import accumulator_dtype


@register("attention_backward", "naive", devices=("cpu", "cuda"), cite="Dao et al. 2022, Algorithm 3")
def naive_attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None):
    scale = check_backward_inputs(q, k, v, o, lse, do, scale, causal)
    check_scores_budget("attention_backward naive", q, k.shape[2], copies=4)  # S, P, dP, dS
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    acc_t = accumulator_dtype(q.dtype)
    qg, og, dog = (t.reshape(B, Hkv, H // Hkv, Nq, d).to(acc_t) for t in (q, o, do))  # (B, Hkv, G, Nq, d)
    kg, vg = k[:, :, None].to(acc_t), v[:, :, None].to(acc_t)  # (B, Hkv, 1, Nk, d)
    L = lse.reshape(B, Hkv, H // Hkv, Nq, 1).to(acc_t)  # (B, Hkv, G, Nq, 1)
    s = qg @ kg.transpose(-1, -2) * scale  # (B, Hkv, G, Nq, Nk)
    if causal:
        s = s.masked_fill(~causal_allowed(Nq, Nk, device=q.device), float("-inf"))
    p = torch.exp(s - torch.where(torch.isfinite(L), L, 0))  # (B, Hkv, G, Nq, Nk)
    dp = dog @ vg.transpose(-1, -2)  # (B, Hkv, G, Nq, Nk)
    ds = p * (dp - (dog * og).sum(-1, keepdim=True))  # (B, Hkv, G, Nq, Nk)
    dq = (ds @ kg * scale).reshape(B, H, Nq, d)  # (B, H, Nq, d)
    dk = (ds.transpose(-1, -2) @ qg).sum(dim=2) * scale  # (B, Hkv, Nk, d): summed over the group
    dv = (p.transpose(-1, -2) @ dog).sum(dim=2)  # (B, Hkv, Nk, d)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
