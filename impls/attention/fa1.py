"""FlashAttention-1 loop order: K/V blocks outer, Q blocks inner, O / l / m read and written per block.

Each key block is loaded once; every query block then reads its (O_i, l_i, m_i) from "HBM",
folds the new block in with the e^(m - m') rescale, renormalizes O_i and writes all three back.
Invariant after key block j: O_i is the exact attention output over keys 0..j.
Dao et al. 2022, "FlashAttention", Sec. 3.1, Algorithm 1.
"""

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs
from llm_inference_harness.impls.attention.tiled import register_tiles
from llm_inference_harness.numerics.online_softmax import accumulator_dtype


def fa1_attention(q, k, v, *, causal=False, scale=None, Br=32, Bc=32):
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    acc_t = accumulator_dtype(q.dtype)
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d).to(acc_t)  # (B, Hkv, G, Nq, d)
    O = torch.zeros(qg.shape, dtype=acc_t, device=q.device)  # noqa: E741 - the "HBM" output, normalized at all times
    l = torch.zeros(qg.shape[:-1], dtype=acc_t, device=q.device)  # noqa: E741 - (B, Hkv, G, Nq)
    m = torch.full(qg.shape[:-1], float("-inf"), dtype=acc_t, device=q.device)
    for j0 in range(0, Nk, Bc):
        j1 = min(j0 + Bc, Nk)
        KjT = k[:, :, None, j0:j1].transpose(-1, -2).to(acc_t)  # (B, Hkv, 1, d, Bc)
        Vj = v[:, :, None, j0:j1].to(acc_t)  # (B, Hkv, 1, Bc, d)
        for i0 in range(0, Nq, Br):
            i1 = min(i0 + Br, Nq)
            if causal and j0 > i1 - 1 + Nk - Nq:  # whole block above the diagonal
                continue
            s = (qg[..., i0:i1, :] @ KjT) * scale  # (B, Hkv, G, Br, Bc)
            if causal:
                s.masked_fill_(~causal_allowed(Nq, Nk, slice(i0, i1), slice(j0, j1), q.device), float("-inf"))
            m_t = s.amax(dim=-1)  # m~_ij
            p_t = torch.exp(s - torch.where(torch.isfinite(m_t), m_t, 0)[..., None])  # P~_ij
            m_i, l_i = m[..., i0:i1], l[..., i0:i1]
            m_new = torch.maximum(m_i, m_t)
            m_safe = torch.where(torch.isfinite(m_new), m_new, 0)
            a, b = torch.exp(m_i - m_safe), torch.exp(m_t - m_safe)  # rescales of old O_i and of the new block
            l_new = a * l_i + b * p_t.sum(dim=-1)
            num = (a * l_i)[..., None] * O[..., i0:i1, :] + b[..., None] * (p_t @ Vj)
            O[..., i0:i1, :] = torch.where(l_new[..., None] == 0, 0, num / torch.where(l_new == 0, 1, l_new)[..., None])
            l[..., i0:i1], m[..., i0:i1] = l_new, m_new
    return O.to(q.dtype).reshape(B, H, Nq, d)  # (B, H, Nq, d)


register_tiles("fa1", fa1_attention, ((32, 32), (64, 64), (24, 40)), io="fa1",
               cite="Dao et al. 2022, FlashAttention, Algorithm 1")
