"""FlashAttention-2 loop order: Q blocks outer, K/V blocks inner, one division at the end.

For each query block the running (m, l, acc) live in registers/SRAM while key blocks stream by;
the output is normalized once after the last key block.  Invariant after key block j: acc / l is
the exact softmax-weighted average over keys 0..j.  Causal key blocks entirely above the
(bottom-right) diagonal are never visited.  Dao 2023, "FlashAttention-2", Sec. 3.1, Algorithm 1.
"""

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs
from llm_inference_harness.impls.attention.tiled import register_tiles
from llm_inference_harness.numerics.online_softmax import accumulator_dtype


def fa2_attention(q, k, v, *, causal=False, scale=None, Br=64, Bc=64):
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    acc_t = accumulator_dtype(q.dtype)
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d): head h reads kv head h // G
    kT = k[:, :, None].transpose(-1, -2)  # (B, Hkv, 1, d, Nk)
    vg = v[:, :, None]  # (B, Hkv, 1, Nk, d)
    out = torch.empty(qg.shape, dtype=q.dtype, device=q.device)  # (B, Hkv, G, Nq, d)
    for i0 in range(0, Nq, Br):
        i1 = min(i0 + Br, Nq)
        qi = qg[..., i0:i1, :].to(acc_t) * scale  # (B, Hkv, G, Br, d)
        m = torch.full(qi.shape[:-1], float("-inf"), dtype=acc_t, device=q.device)  # (B, Hkv, G, Br)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros(qi.shape, dtype=acc_t, device=q.device)  # (B, Hkv, G, Br, d)
        k_end = min(Nk, i1 + Nk - Nq) if causal else Nk  # blocks past the last row's diagonal: skipped
        for j0 in range(0, k_end, Bc):
            j1 = min(j0 + Bc, Nk)
            s = qi @ kT[..., j0:j1].to(acc_t)  # (B, Hkv, G, Br, Bc)
            if causal and j1 - 1 > i0 + Nk - Nq:  # block crosses the diagonal: mask inside it
                s.masked_fill_(~causal_allowed(Nq, Nk, slice(i0, i1), slice(j0, j1), q.device), float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_safe = torch.where(torch.isfinite(m_new), m_new, 0)
            s.sub_(m_safe[..., None]).exp_()  # P~ in place: (B, Hkv, G, Br, Bc)
            alpha = torch.exp(m - m_safe)  # e^(m - m'): rescales what was accumulated so far
            l = alpha * l + s.sum(dim=-1)  # noqa: E741
            acc = alpha[..., None] * acc + s @ vg[..., j0:j1, :].to(acc_t)
            m = m_new
        out[..., i0:i1, :] = torch.where(l[..., None] == 0, 0, acc / torch.where(l == 0, 1, l)[..., None])
    return out.reshape(B, H, Nq, d)  # (B, H, Nq, d)


register_tiles("fa2", fa2_attention, ((64, 64), (128, 128), (256, 256), (48, 80), (17, 33)), io="fa2",
               cite="Dao 2023, FlashAttention-2, Algorithm 1")
