"""FlashAttention-2 for the CPU with no row-max pass: no shift at all, checked once per query block.

Softmax is shift-invariant, so any m works as long as 2^(S - m) neither overflows nor underflows the
row.  Scores are kept in base 2 (the QK^T GEMM scales by scale * log2(e) as its alpha; exp2 costs half
of exp here, as in FlashAttention-2's kernels).  Each key block is two GEMMs, one in-place exp2 and one row sum:
P~ = 2^(S - m), l += rowsum(P~), acc += P~ V_j -- no amax, no comparison, no rescale.  Three tiers per
query block, each proved by its row sums after the fact (l >= every 2^(S - m), so l <= 2^40 proves
nothing overflowed; l >= 2^-60 proves the largest term is a normal float, so underflowed terms are
below 2^-89 of the sum):
  1. m = 0: S = Q_i K_j^T straight out of bmm, nothing written before the GEMM (the common case:
     |scores| < ~27 nats);
  2. m = the scores against key 0 (every visited row sees key 0, so m <= the row max and l >= 1),
     subtracted inside the GEMM by baddbmm (logits with a large common offset, attention sinks);
  3. exact FA-2 with a running max (adversarial logits).
Invariant after key block j: acc and l are the exact softmax numerator and denominator over keys
0..j for the fixed shift m.  Dao 2023, "FlashAttention-2", Algorithm 1; the fixed shift generalises
FlashAttention-4's conditional rescaling (Dao et al. 2025) from "max grew by more than tau" to
"never, unless the sums prove it was needed".
"""

import math

import torch

from harness.contracts.attention import causal_allowed, check_inputs, no_work_output
from impls.attention.merge import accumulator_dtype
from impls.attention.tiled import register_tiles

LIMIT = 2.0**40  # largest row sum accepted from a fixed shift: every 2^(S - m) <= 2^40, far from overflow
FLOOR = 2.0**-60  # smallest row sum accepted: its largest term is a normal float32, the lost ones < 2^-89 of it


def fa2_optimistic_attention(q, k, v, *, causal=False, scale=None, Br=128, Bc=256):
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    if (empty := no_work_output(q, Nk)) is not None:  # no rows: trusted() would take the min of nothing
        return empty
    G, acc_t, BH = H // Hkv, accumulator_dtype(q.dtype), B * Hkv
    alpha = scale * math.log2(math.e)  # base-2 scores; applied by the GEMM, not by a pass over q
    qs = q.to(acc_t).reshape(BH, G, Nq, d).transpose(1, 2).reshape(BH, Nq * G, d)  # (B*Hkv, Nq*G, d): row (i, g)
    if alpha == 0:  # BLAS never reads A and B when alpha = 0: a NaN in q or k would vanish from 0 * (q k^T)
        qs, alpha = qs * 0, 1.0
    kT = k.to(acc_t).reshape(BH, Nk, d).transpose(1, 2)  # (B*Hkv, d, Nk): no copy when dtypes match
    vv = v.to(acc_t).reshape(BH, Nk, d)  # (B*Hkv, Nk, d)
    first_row = max(0, Nq - Nk) if causal else 0  # rows before it see no key (bottom-right mask)
    out = torch.empty(BH, G, Nq, d, dtype=q.dtype, device=q.device)  # every row is written below
    out[:, :, : first_row if Nk else Nq] = 0  # rows that see no key
    R, masks = min(Br, Nq) * G, {}
    work = (torch.empty(BH * R * min(Bc, Nk), dtype=acc_t, device=q.device),  # one score block, and acc, l:
            torch.empty(BH, R, d, dtype=acc_t, device=q.device), torch.empty(BH, R, 1, dtype=acc_t, device=q.device))
    for i0 in range(first_row, Nq if Nk else 0, Br):
        i1 = min(i0 + Br, Nq)
        qi = qs[:, i0 * G : i1 * G]  # (B*Hkv, Br*G, d): the G query heads of a kv head side by side in each row
        k_end = min(Nk, i1 + Nk - Nq) if causal else Nk  # key blocks past the last row's diagonal: skipped
        blocks = []
        for j0 in range(0, k_end, Bc):
            j1 = min(j0 + Bc, k_end)
            bias = diagonal_bias(masks, Nq, Nk, (i0, i1), (j0, j1), G, acc_t, q.device) \
                if causal and j1 - 1 > i0 + Nk - Nq else None  # block crosses the diagonal: 0 / -inf
            blocks.append((j0, j1, bias))
        acc, l = fixed_shift_block(qi, kT, vv, blocks, None, work, alpha)  # noqa: E741 - (.., Br*G, d), (.., Br*G, 1)
        if not trusted(acc, l):  # scores far from 0: shift by the scores against key 0
            neg_m = torch.bmm(qi, kT[..., :1]).mul_(-alpha)  # (B*Hkv, Br*G, 1)
            acc, l = fixed_shift_block(qi, kT, vv, blocks, neg_m, work, alpha)  # noqa: E741
            if not trusted(acc, l):  # m was far below some row's max: redo exactly
                acc, l = running_max_block(qi, kT, vv, blocks, alpha)  # noqa: E741
        rows = (BH, i1 - i0, G)
        torch.div(acc.view(*rows, d), l.view(*rows, 1), out=out[:, :, i0:i1].transpose(1, 2))  # (B*Hkv, Br, G, d)
    return out.reshape(B, H, Nq, d)  # (B, H, Nq, d)


def fixed_shift_block(qi, kT, vv, blocks, neg_m, work, alpha):
    """acc (B*Hkv, Br*G, d) and l (B*Hkv, Br*G, 1) of one query block for the row shift -neg_m (None: 0).

    Everything goes to `work`, buffers reused by every block: fresh 2 MB tensors would be fresh pages from
    the OS, and their page faults cost as much as a third of the GEMM that fills them."""
    scores, acc, l = work[0], work[1][:, : qi.shape[1]], work[2][:, : qi.shape[1]]  # noqa: E741
    for n, (j0, j1, bias) in enumerate(blocks):
        shift = neg_m if bias is None else bias if neg_m is None else neg_m + bias
        s = scores[: qi.shape[0] * qi.shape[1] * (j1 - j0)].view(qi.shape[0], qi.shape[1], j1 - j0)  # (.., Br*G, Bc)
        if shift is None:
            s.baddbmm_(qi, kT[..., j0:j1], beta=0, alpha=alpha)  # beta=0: s's old values are never read
        else:
            torch.baddbmm(shift, qi, kT[..., j0:j1], alpha=alpha, out=s)
        s.exp2_()
        if n == 0:  # the first key block initializes the sums
            torch.sum(s, dim=-1, keepdim=True, out=l)
            torch.bmm(s, vv[:, j0:j1], out=acc)
        else:
            l.add_(s.sum(dim=-1, keepdim=True))
            acc.baddbmm_(s, vv[:, j0:j1])  # acc += P~ V_j
    return acc, l


def trusted(acc, l) -> bool:  # noqa: E741
    """Every row sum in [FLOOR, LIMIT] and acc finite (NaN fails every comparison; a sum of finite values
    that overflows only sends a good block to the next tier): the fixed shift lost nothing."""
    return FLOOR <= float(l.min()) and float(l.max()) <= LIMIT and math.isfinite(float(acc.sum()))


def running_max_block(qi, kT, vv, blocks, alpha):
    """The same block by exact FA-2: the max moves with every key block and rescales acc and l."""
    m = torch.full((qi.shape[0], qi.shape[1], 1), float("-inf"), dtype=qi.dtype, device=qi.device)
    acc = qi.new_zeros(qi.shape[0], qi.shape[1], vv.shape[-1])  # (B*Hkv, Br*G, d)
    l = qi.new_zeros(m.shape)  # noqa: E741 - (B*Hkv, Br*G, 1)
    for j0, j1, bias in blocks:
        s = torch.bmm(qi, kT[..., j0:j1]).mul_(alpha) if bias is None else \
            torch.baddbmm(bias, qi, kT[..., j0:j1], alpha=alpha)  # (.., Br*G, Bc)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # finite once a row has seen a key
        shift = torch.where(torch.isfinite(m_new), m_new, 0)  # rows with no key yet: keep 2^-inf = 0
        rescale = torch.exp2(m - shift)  # 2^(m_old - m_new); 0 while m_old = -inf
        s.sub_(shift).exp2_()
        l.mul_(rescale).add_(s.sum(dim=-1, keepdim=True))
        acc.mul_(rescale).baddbmm_(s, vv[:, j0:j1])
        m = m_new
    return acc, l


def diagonal_bias(masks: dict, Nq: int, Nk: int, rows, cols, G: int, dtype, device) -> torch.Tensor:
    """0 / -inf (Br*G, Bc) for a block crossing the causal diagonal, built once per offset and size."""
    key = (rows[0] - cols[0], rows[1] - rows[0], cols[1] - cols[0])
    if key not in masks:
        allowed = causal_allowed(Nq, Nk, slice(*rows), slice(*cols), device)  # (Br, Bc)
        masks[key] = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(
            ~allowed, float("-inf")).repeat_interleave(G, dim=0)  # (Br*G, Bc): row (i, g)
    return masks[key]


register_tiles("fa2_optimistic", fa2_optimistic_attention, ((128, 256), (256, 256), (17, 33)), io="fa2",
               cite="Dao 2023, FlashAttention-2, Algorithm 1, with a fixed shift checked through the row sums")
