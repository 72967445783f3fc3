"""FlashAttention-2 forward that also returns the per-row logsumexp L = m + log l, what its backward needs.

Same loop as impls/attention/fa2.py (Q blocks outer, K/V blocks inner, one division at the end); at
the end of a query block the running max m and sum l give L_i = m_i + log l_i, so the backward can
recompute P_ij = exp(S_ij - L_i) without storing P.  Invariant after key block j: acc / l is the
softmax average over keys 0..j and m + log l their logsumexp.  Rows that see no key: o = 0, L = -inf.
Dao 2023, "FlashAttention-2", Sec. 3.1, Algorithm 1 (line 13: L_i = m_i + log l_i).
"""

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.numerics.online_softmax import accumulator_dtype


def fa2_forward_lse(q, k, v, *, causal=False, scale=None, Br=64, Bc=64):
    """Returns (o, L): o like the forward contract, L (B, H, Nq) in float32 (half inputs) or q's dtype."""
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    acc_t = accumulator_dtype(q.dtype)
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d)
    kT, vg = k[:, :, None].transpose(-1, -2), v[:, :, None]  # (B, Hkv, 1, d, Nk), (B, Hkv, 1, Nk, d)
    out = torch.empty(qg.shape, dtype=q.dtype, device=q.device)  # (B, Hkv, G, Nq, d)
    lse = torch.empty(qg.shape[:-1], dtype=acc_t, device=q.device)  # (B, Hkv, G, Nq)
    for i0 in range(0, Nq, Br):
        i1 = min(i0 + Br, Nq)
        qi = qg[..., i0:i1, :].to(acc_t) * scale  # (B, Hkv, G, Br, d)
        m = torch.full(qi.shape[:-1], float("-inf"), dtype=acc_t, device=q.device)  # (B, Hkv, G, Br)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros(qi.shape, dtype=acc_t, device=q.device)  # (B, Hkv, G, Br, d)
        for j0 in range(0, min(Nk, i1 + Nk - Nq) if causal else Nk, Bc):
            j1 = min(j0 + Bc, Nk)
            s = qi @ kT[..., j0:j1].to(acc_t)  # (B, Hkv, G, Br, Bc)
            if causal and j1 - 1 > i0 + Nk - Nq:
                s.masked_fill_(~causal_allowed(Nq, Nk, slice(i0, i1), slice(j0, j1), q.device), float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_safe = torch.where(torch.isfinite(m_new), m_new, 0)
            s.sub_(m_safe[..., None]).exp_()  # P~: (B, Hkv, G, Br, Bc)
            alpha = torch.exp(m - m_safe)
            l = alpha * l + s.sum(dim=-1)  # noqa: E741
            acc = alpha[..., None] * acc + s @ vg[..., j0:j1, :].to(acc_t)
            m = m_new
        out[..., i0:i1, :] = torch.where(l[..., None] == 0, 0, acc / torch.where(l == 0, 1, l)[..., None])
        lse[..., i0:i1] = m + torch.log(l)  # l = 0 (no key seen) gives -inf
    return out.reshape(B, H, Nq, d), lse.reshape(B, H, Nq)  # (B, H, Nq, d), (B, H, Nq)


@register("attention", "fa2_lse_64x64", devices=("cpu", "cuda"), cite="Dao 2023, FlashAttention-2, Algorithm 1",
          caps={"Br": 64, "Bc": 64, "tiled": True, "returns_lse": True})
def fa2_lse_attention(q, k, v, *, causal=False, scale=None, return_lse=False):
    o, lse = fa2_forward_lse(q, k, v, causal=causal, scale=scale)
    return (o, lse) if return_lse else o
