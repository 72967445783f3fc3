"""FlashAttention-2 backward: K/V blocks outer, Q blocks inner, each P block recomputed from Q, K and L.

No (Nq, Nk) matrix is ever stored: for key block j, every query block i recomputes
S_ij = scale Q_i K_j^T and P_ij = exp(S_ij - L_i), then dV_j += P_ij^T dO_i, dP_ij = dO_i V_j^T,
dS_ij = P_ij o (dP_ij - D_i) with D_i = dO_i . O_i (computed once, = sum_j P_ij dP_ij),
dQ_i += scale dS_ij K_j, dK_j += scale dS_ij^T Q_i.  Invariant: after the inner loop dK_j, dV_j are
complete (summed over all query rows and the G query heads sharing the kv head).  Causal query blocks
entirely above the (bottom-right) diagonal of key block j are skipped.
Dao 2023, "FlashAttention-2", Sec. 3.2, Algorithm 2.
"""

import torch

from llm_inference_harness.contracts.attention import causal_allowed
from llm_inference_harness.contracts.attention_backward import check_backward_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.numerics.online_softmax import accumulator_dtype


def fa2_attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, Br=64, Bc=64):
    scale = check_backward_inputs(q, k, v, o, lse, do, scale, causal)
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    acc_t = accumulator_dtype(q.dtype)
    qg, dog = (t.reshape(B, Hkv, H // Hkv, Nq, d) for t in (q, do))  # (B, Hkv, G, Nq, d)
    D = (dog.to(acc_t) * o.reshape(qg.shape).to(acc_t)).sum(-1)  # (B, Hkv, G, Nq): D_i = dO_i . O_i
    L = lse.reshape(D.shape).to(acc_t)  # (B, Hkv, G, Nq)
    L = torch.where(torch.isfinite(L), L, 0)  # rows that see no key: every S is -inf, so P = exp(-inf) = 0
    dq = torch.zeros(qg.shape, dtype=acc_t, device=q.device)  # (B, Hkv, G, Nq, d)
    dk, dv = torch.empty_like(k), torch.empty_like(v)  # (B, Hkv, Nk, d)
    for j0 in range(0, Nk, Bc):
        j1 = min(j0 + Bc, Nk)
        kj, vj = k[:, :, None, j0:j1].to(acc_t), v[:, :, None, j0:j1].to(acc_t)  # (B, Hkv, 1, Bc, d)
        dkj = torch.zeros(B, Hkv, j1 - j0, d, dtype=acc_t, device=q.device)  # (B, Hkv, Bc, d)
        dvj = torch.zeros_like(dkj)
        for i0 in range(max(0, j0 - (Nk - Nq)) if causal else 0, Nq, Br):  # rows i < j0 - (Nk - Nq) see none
            i1 = min(i0 + Br, Nq)
            qi, doi = qg[..., i0:i1, :].to(acc_t), dog[..., i0:i1, :].to(acc_t)  # (B, Hkv, G, Br, d)
            s = qi @ kj.transpose(-1, -2) * scale  # (B, Hkv, G, Br, Bc)
            if causal and j1 - 1 > i0 + Nk - Nq:  # block crosses the diagonal: mask inside it
                s.masked_fill_(~causal_allowed(Nq, Nk, slice(i0, i1), slice(j0, j1), q.device), float("-inf"))
            p = torch.exp(s - L[..., i0:i1, None])  # P_ij recomputed: (B, Hkv, G, Br, Bc)
            dvj += (p.transpose(-1, -2) @ doi).sum(dim=2)  # (B, Hkv, Bc, d): summed over the group
            ds = p * (doi @ vj.transpose(-1, -2) - D[..., i0:i1, None])  # dS_ij: (B, Hkv, G, Br, Bc)
            dq[..., i0:i1, :] += ds @ kj * scale
            dkj += (ds.transpose(-1, -2) @ qi).sum(dim=2) * scale
        dk[:, :, j0:j1], dv[:, :, j0:j1] = dkj, dvj
    return dq.to(q.dtype).reshape(B, H, Nq, d), dk, dv  # (B, H, Nq, d), (B, Hkv, Nk, d) x 2


for _Br, _Bc in ((64, 64), (48, 80), (17, 33)):
    register(
        "attention_backward", f"fa2_{_Br}x{_Bc}", devices=("cpu", "cuda"),
        cite="Dao 2023, FlashAttention-2, Algorithm 2", caps={"Br": _Br, "Bc": _Bc, "tiled": True},
    )(lambda q, k, v, o, lse, do, *, causal=False, scale=None, _Br=_Br, _Bc=_Bc: fa2_attention_backward(
        q, k, v, o, lse, do, causal=causal, scale=scale, Br=_Br, Bc=_Bc))
