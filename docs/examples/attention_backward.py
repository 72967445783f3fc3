"""The standard attention backward from the forward's L: a plugin for the attention_backward contract
(harness/contracts/attention_backward.py).  P = exp(S - L); dV = P^T dO; dS = P * (dP - D), D = rowsum(dO * O).

    harness check attention_backward --plugin docs/examples/attention_backward.py:attention_backward
"""

import torch

from llm_inference_harness import declare
from llm_inference_harness.contracts.attention import check_scores_budget
from llm_inference_harness.contracts.attention_backward import check_backward_inputs


@declare(dtypes=("float32", "float64"), devices=("cpu",))
def attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None):
    scale = check_backward_inputs(q, k, v, o, lse, do, scale, causal)
    check_scores_budget("my backward", q, k.shape[2], copies=4)  # S, P, dP, dS: refused past the budget
    B, H, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = H // Hkv
    kh, vh = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # (B, H, Nk, d)
    s = q @ kh.transpose(-1, -2) * scale  # (B, H, Nq, Nk)
    if causal:
        i, j = torch.arange(Nq)[:, None], torch.arange(Nk)[None, :]
        s = s.masked_fill(j > i + Nk - Nq, float("-inf"))
    L = torch.where(torch.isfinite(lse), lse, 0).to(q.dtype)[..., None]  # (B, H, Nq, 1); -inf rows: P = 0
    p = torch.exp(s - L)  # (B, H, Nq, Nk)
    dp = do @ vh.transpose(-1, -2)  # (B, H, Nq, Nk)
    ds = p * (dp - (do * o).sum(dim=-1, keepdim=True))  # (B, H, Nq, Nk)
    dq = ds @ kh * scale  # (B, H, Nq, d)
    dk = (ds.transpose(-1, -2) @ q * scale).reshape(B, Hkv, G, Nk, d).sum(dim=2)  # (B, Hkv, Nk, d): summed over G
    dv = (p.transpose(-1, -2) @ do).reshape(B, Hkv, G, Nk, d).sum(dim=2)  # (B, Hkv, Nk, d)
    return dq, dk, dv
