"""FlashAttention-2 tuned for the CPU: the max subtraction folded into the QK^T GEMM, lazy rescaling.

The FA-2 loop (query blocks outer, key blocks inner, one division at the end) with four changes
that remove whole passes over each (Br x Bc) score block:
  * q is scaled once; batch and kv heads fold into one GEMM batch, and the G query heads that share
    a kv head stack their rows (GQA), so every block is one bmm/baddbmm;
  * the running max m is subtracted inside the GEMM: S - m = baddbmm(-m, Q_i, K_j^T), and the
    causal mask rides along in the same operand (0 / -inf) on blocks that cross the diagonal;
  * lazy rescaling: m (and with it acc, l) is only moved when a row's new scores exceed it by more
    than tau, so e^(S - m) <= e^tau never overflows while most blocks skip the rescale entirely;
  * query rows that see no key (causal, Nq > Nk) are never visited, so every visited row has a
    finite max after its first key block and no isfinite guards are needed.
Invariant after key block j: acc / l is the exact softmax-weighted average over keys 0..j, and
m <= true row max <= m + tau.  Dao 2023, "FlashAttention-2", Algorithm 1; the conditional rescale
with tau = 8 is FlashAttention-4's (Dao et al. 2025; described in Modal, "Reverse-engineering
FlashAttention-4", 2025).
"""

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs
from llm_inference_harness.impls.attention.tiled import register_tiles
from llm_inference_harness.numerics.online_softmax import accumulator_dtype

TAU = 8.0  # rescale only when a row max grows by more than this: p = e^(s - m) stays <= e^8


def fa2_lazy_attention(q, k, v, *, causal=False, scale=None, Br=128, Bc=256):
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    G, acc_t, BH = H // Hkv, accumulator_dtype(q.dtype), B * Hkv
    qs = (q.to(acc_t) * scale).reshape(BH, G, Nq, d)  # (B*Hkv, G, Nq, d): scaled once
    kT = k.to(acc_t).reshape(BH, Nk, d).transpose(1, 2)  # (B*Hkv, d, Nk): no copy when dtypes match
    vv = v.to(acc_t).reshape(BH, Nk, d)  # (B*Hkv, Nk, d)
    out = torch.zeros(BH, G, Nq, d, dtype=q.dtype, device=q.device)  # rows that see no key stay 0
    first_row = max(0, Nq - Nk) if causal else 0  # rows before it see no key (bottom-right mask)
    for i0 in range(first_row, Nq if Nk else 0, Br):
        i1 = min(i0 + Br, Nq)
        qi = qs[:, :, i0:i1].reshape(BH, G * (i1 - i0), d)  # (B*Hkv, G*Br, d): G heads stack their rows
        k_end = min(Nk, i1 + Nk - Nq) if causal else Nk  # key blocks past the last row's diagonal: skipped
        m = None
        for j0 in range(0, k_end, Bc):
            j1 = min(j0 + Bc, k_end)
            shift = 0.0 if m is None else -m[..., None]  # (B*Hkv, G*Br, 1)
            if causal and j1 - 1 > i0 + Nk - Nq:  # block crosses the diagonal: add 0 / -inf
                allowed = causal_allowed(Nq, Nk, slice(i0, i1), slice(j0, j1), q.device)  # (Br, Bc)
                shift = shift + torch.zeros(allowed.shape, dtype=acc_t, device=q.device).masked_fill_(
                    ~allowed, float("-inf")).repeat(G, 1)  # (G*Br, Bc)
            if m is None:  # first key block: every row sees key 0, so its max is finite
                s = torch.bmm(qi, kT[..., j0:j1]).add_(shift)  # (B*Hkv, G*Br, Bc)
                m = s.amax(dim=-1)  # (B*Hkv, G*Br)
                s.sub_(m[..., None]).exp_()
                l, acc = s.sum(dim=-1), torch.bmm(s, vv[:, j0:j1])  # noqa: E741 - (B*Hkv, G*Br), (.., d)
                continue
            s = torch.baddbmm(shift, qi, kT[..., j0:j1])  # S - m: (B*Hkv, G*Br, Bc)
            grow = s.amax(dim=-1)  # how far each row's max moved past m
            if bool((grow > TAU).any()):  # lazy rescale: only rows that moved by more than tau
                delta = torch.where(grow > TAU, grow, 0)  # (B*Hkv, G*Br)
                s.sub_(delta[..., None])
                m.add_(delta)
                alpha = torch.exp(-delta)  # e^(m_old - m_new)
                l.mul_(alpha)
                acc.mul_(alpha[..., None])
            s.exp_()  # P~ in place
            l.add_(s.sum(dim=-1))
            acc.baddbmm_(s, vv[:, j0:j1])  # acc += P~ V_j
        out[:, :, i0:i1] = (acc / l[..., None]).reshape(BH, G, i1 - i0, d)  # (B*Hkv, G, Br, d)
    return out.reshape(B, H, Nq, d)  # (B, H, Nq, d)


register_tiles("fa2_lazy_rescale", fa2_lazy_attention, ((128, 256), (128, 512), (17, 33)), io="fa2",
               cite="Dao 2023, FlashAttention-2, Algorithm 1 + FlashAttention-4 conditional rescaling")
