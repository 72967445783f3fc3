"""FlashAttention-2 for the CPU with no row-max pass: no shift at all, checked once per query block.

Softmax is shift-invariant, so any m works as long as e^(S - m) neither overflows nor underflows the
row.  Each key block is two GEMMs (the first scales by its alpha, not by a pass over q), one in-place
exp and one row sum: P~ = e^(S - m), l += rowsum(P~), acc += P~ V_j -- no amax, no comparison, no
rescale.  The exp is e^x, or 2^x of scores scaled by log2(e) as FlashAttention-2's kernels do,
whichever this CPU runs faster, timed once: exp_ took 55% of exp2_'s time on an AVX-512 Xeon, exp2_
half of exp_'s on the AMD EPYC this project first ran on.  Three tiers per query block, each proved
by its row sums after the fact (l >= every e^(S - m), so l <= 2^40 proves nothing overflowed;
l >= 2^-60 proves the largest term is a normal float, so underflowed terms are below 2^-89 of the sum):
  1. m = 0: S = Q_i K_j^T straight out of bmm, nothing written before the GEMM (the common case:
     |scores| < ~27 nats);
  2. m = the scores against key 0 (every visited row sees key 0, so m <= the row max and l >= 1),
     subtracted inside the GEMM by baddbmm (logits with a large common offset, attention sinks);
  3. exact FA-2 with a running max (adversarial logits).
Invariant after key block j: acc and l are the exact softmax numerator and denominator over keys
0..j for the fixed shift m.  A causal block crossing the diagonal zeroes what its rows may not see
after the exp (tril_), and the kv heads go through in groups whose score block fits in L2.
Dao 2023, "FlashAttention-2", Algorithm 1; the fixed shift generalises FlashAttention-4's
conditional rescaling (Dao et al. 2025) from "max grew by more than tau" to "never, unless the sums
prove it was needed".
"""

import math
import time
from functools import cache, partial
from typing import NamedTuple

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs, no_work_output
from llm_inference_harness.impls.attention.tiled import register_tiles
from llm_inference_harness.numerics.online_softmax import accumulator_dtype

LIMIT = 2.0**40  # largest row sum accepted from a fixed shift: every e^(S - m) <= 2^40, far from overflow
FLOOR = 2.0**-60  # smallest row sum accepted: its largest term is a normal float32, the lost ones < 2^-89 of it
EXP, EXP2 = (1.0, torch.Tensor.exp_), (math.log2(math.e), torch.Tensor.exp2_)  # (score factor, in-place exp)
# Floats of one pass's score block per CPU thread (1 MiB in float32): a core's 2 MiB L2 keeps its heads' block between
# the GEMM that writes it and the exp, row sum and GEMM that read it (the batched GEMM gives each thread its own heads).
# At 256 x 512 on one thread that is two kv heads per pass instead of eight.
SCORE_FLOATS = 2**18


def fa2_optimistic_attention(q, k, v, *, causal=False, scale=None, Br=128, Bc=256, score_floats=None, exp2=None):
    """The attention contract's call; `score_floats` caps a pass's score block (None: SCORE_FLOATS per CPU
    thread, every head at once on a GPU), `exp2` pins the exp's base (None: whichever `faster_exp2` found
    faster)."""
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    if (empty := no_work_output(q, Nk)) is not None:  # no rows: trusted() would take the min of nothing
        return empty
    G, acc_t, BH = H // Hkv, accumulator_dtype(q.dtype), B * Hkv
    factor, exp_ = EXP2 if (faster_exp2(q.device.type) if exp2 is None else exp2) else EXP
    alpha = scale * factor  # applied by the GEMM, not by a pass over q
    qs = q.to(acc_t).reshape(BH, G, Nq, d).transpose(1, 2).reshape(BH, Nq * G, d)  # (B*Hkv, Nq*G, d): row (i, g)
    if alpha == 0:  # BLAS never reads A and B when alpha = 0: a NaN in q or k would vanish from 0 * (q k^T)
        qs, alpha = qs * 0, 1.0
    kT = k.to(acc_t).reshape(BH, Nk, d).transpose(1, 2)  # (B*Hkv, d, Nk): no copy when dtypes match
    vv = v.to(acc_t).reshape(BH, Nk, d)  # (B*Hkv, Nk, d)
    first_row = max(0, Nq - Nk) if causal else 0  # rows before it see no key (bottom-right mask)
    out = torch.empty(BH, G, Nq, d, dtype=q.dtype, device=q.device)  # every row is written below
    out[:, :, : first_row if Nk else Nq] = 0  # rows that see no key
    R, masks = min(Br, Nq) * G, {}
    if score_floats is None:
        score_floats = SCORE_FLOATS * torch.get_num_threads() if q.device.type == "cpu" else BH * R * min(Bc, Nk)
    HG = max(1, min(BH, score_floats // (R * min(Bc, Nk or 1))))  # kv heads per pass, as many as the budget holds
    work = Work(torch.empty(HG * R * min(Bc, Nk), dtype=acc_t, device=q.device), *(
        torch.empty(HG, R, n, dtype=acc_t, device=q.device) for n in (d, 1, 1)), views={})
    plans = []  # per query block: rows, key blocks, their -inf bias, tril's diagonal
    for i0 in range(first_row, Nq if Nk else 0, Br):
        i1 = min(i0 + Br, Nq)
        k_end = min(Nk, i1 + Nk - Nq) if causal else Nk  # key blocks past the last row's diagonal: skipped
        # (j0, j1, whether the block's last key is past its first row's diagonal)
        blocks = [(j0, min(j0 + Bc, k_end), causal and min(j0 + Bc, k_end) - 1 > i0 + Nk - Nq)
                  for j0 in range(0, k_end, Bc)]
        bias = partial(diagonal_bias, masks, Nq, Nk, (i0, i1), G=G, dtype=acc_t, device=q.device)  # bias((j0, j1))
        plans.append((i0, i1, blocks, bias, i0 + Nk - Nq if G == 1 else None))  # G = 1: the mask is a triangle
    for h0 in range(0, BH, HG):  # a group's K and V stay cached across its query blocks
        qh, kTh, vvh, oh = qs[h0 : h0 + HG], kT[h0 : h0 + HG], vv[h0 : h0 + HG], out[h0 : h0 + HG]
        for i0, i1, blocks, bias, tril in plans:
            qi = qh[:, i0 * G : i1 * G]  # (HG, Br*G, d): the G query heads of a kv head side by side in each row
            acc, l = query_block(qi, kTh, vvh, blocks, work, alpha, exp_, bias, tril)  # noqa: E741
            normalize_into(oh[:, :, i0:i1].transpose(1, 2), acc, l)  # (HG, Br, G, d)
    return out.reshape(B, H, Nq, d)  # (B, H, Nq, d)


class Work(NamedTuple):
    """Buffers reused by every block: fresh 1-2 MB tensors would be fresh pages from the OS, whose page
    faults cost as much as a third of the GEMM that fills them."""
    scores: torch.Tensor  # flat, one pass's score block
    acc: torch.Tensor  # (HG, Br*G, d)
    l: torch.Tensor  # noqa: E741 - (HG, Br*G, 1)
    sums: torch.Tensor  # (HG, Br*G, 1): one key block's row sums
    views: dict  # (heads, rows, keys) -> that view of scores, made once

    def scores_view(self, *shape: int) -> torch.Tensor:
        if shape not in self.views:
            self.views[shape] = self.scores[: math.prod(shape)].view(shape)
        return self.views[shape]


def normalize_into(dest, acc, l):  # noqa: E741
    """dest (HG, Br, G, d) = acc / l, from acc (HG, Br*G, d) and l (HG, Br*G, 1) in rows (i, g)."""
    if dest.shape[2] == 1:  # 3-d: the 4-d broadcast takes 1.4x as long
        torch.div(acc, l, out=dest.squeeze(2))
    else:
        rows = dest.shape[:3]
        torch.div(acc.view(*rows, -1), l.view(*rows, 1), out=dest)


def query_block(qi, kT, vv, blocks, work, alpha, exp_, bias, tril):
    """acc (HG, Br*G, d) and l (HG, Br*G, 1) of one query block, from the first tier its row sums prove exact."""
    acc, l = fixed_shift_block(qi, kT, vv, blocks, None, work, alpha, exp_, bias, tril)  # noqa: E741
    if not trusted(acc, l):  # scores far from 0: shift by the scores against key 0
        neg_m = torch.bmm(qi, kT[..., :1]).mul_(-alpha)  # (HG, Br*G, 1)
        acc, l = fixed_shift_block(qi, kT, vv, blocks, neg_m, work, alpha, exp_, bias, tril)  # noqa: E741
        if not trusted(acc, l):  # m was far below some row's max: redo exactly
            acc, l = running_max_block(qi, kT, vv, blocks, alpha, exp_, bias)  # noqa: E741
    return acc, l


def fixed_shift_block(qi, kT, vv, blocks, neg_m, work, alpha, exp_, bias, tril):
    """acc (HG, Br*G, d) and l (HG, Br*G, 1) of one query block for the row shift -neg_m (None: 0).

    A block crossing the diagonal gets its -inf `bias((j0, j1))` from the GEMM, or, given `tril` (the
    query block's first row's last visible key, when each score row is one query row), tril_ zeroes the
    terms its rows may not see after exp, writing only those zeros: the bias costs a pass before the GEMM.
    Everything goes to `work`."""
    acc, l, sums = (t[: qi.shape[0], : qi.shape[1]] for t in (work.acc, work.l, work.sums))  # noqa: E741
    for n, (j0, j1, crosses) in enumerate(blocks):
        mask = bias((j0, j1)) if crosses and tril is None else None
        shift = neg_m if mask is None else mask if neg_m is None else neg_m + mask
        s = work.scores_view(qi.shape[0], qi.shape[1], j1 - j0)  # (HG, Br*G, Bc)
        if shift is None:
            s.baddbmm_(qi, kT[..., j0:j1], beta=0, alpha=alpha)  # beta=0: s's old values are never read
        else:
            torch.baddbmm(shift, qi, kT[..., j0:j1], alpha=alpha, out=s)
        exp_(s)
        if crosses and tril is not None:
            s.tril_(tril - j0)  # row r keeps keys j0 + c <= tril + r; what exp made of the others is dropped
        if n == 0:  # the first key block initializes the sums
            torch.sum(s, dim=-1, keepdim=True, out=l)
            torch.bmm(s, vv[:, j0:j1], out=acc)
        else:
            l.add_(torch.sum(s, dim=-1, keepdim=True, out=sums))
            acc.baddbmm_(s, vv[:, j0:j1])  # acc += P~ V_j
    return acc, l


def trusted(acc, l) -> bool:  # noqa: E741
    """Every row sum in [FLOOR, LIMIT] and acc finite (NaN fails every comparison; a sum of finite values
    that overflows only sends a good block to the next tier): the fixed shift lost nothing."""
    low, high = torch.aminmax(l)
    return FLOOR <= float(low) and float(high) <= LIMIT and math.isfinite(float(acc.sum()))


def running_max_block(qi, kT, vv, blocks, alpha, exp_, bias):
    """The same block by exact FA-2: the max moves with every key block and rescales acc and l."""
    m = torch.full((qi.shape[0], qi.shape[1], 1), float("-inf"), dtype=qi.dtype, device=qi.device)
    acc = qi.new_zeros(qi.shape[0], qi.shape[1], vv.shape[-1])  # (HG, Br*G, d)
    l = qi.new_zeros(m.shape)  # noqa: E741 - (HG, Br*G, 1)
    for j0, j1, crosses in blocks:
        s = torch.baddbmm(bias((j0, j1)), qi, kT[..., j0:j1], alpha=alpha) if crosses else \
            torch.bmm(qi, kT[..., j0:j1]).mul_(alpha)  # (.., Br*G, Bc)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # finite once a row has seen a key
        shift = torch.where(torch.isfinite(m_new), m_new, 0)  # rows with no key yet: keep e^-inf = 0
        rescale = exp_(m - shift)  # e^(m_old - m_new) or 2^: 0 while m_old = -inf
        exp_(s.sub_(shift))
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


@cache
def faster_exp2(device_type: str) -> bool:
    """Whether exp2_ beats exp_ here, best of 5 on 64k floats; on a GPU exp2 is the instruction exp is made of."""
    if device_type != "cpu":
        return True
    x, y = torch.linspace(-20.0, 0.0, 1 << 16), torch.empty(1 << 16)
    seconds = {}
    for op in (torch.exp2, torch.exp) * 5:
        start = time.perf_counter()
        op(x, out=y)
        seconds[op] = min(seconds.get(op, math.inf), time.perf_counter() - start)
    return seconds[torch.exp2] < seconds[torch.exp]


register_tiles("fa2_optimistic", fa2_optimistic_attention, ((128, 256), (256, 512), (17, 33)), io="fa2",
               cite="Dao 2023, FlashAttention-2, Algorithm 1, with a fixed shift checked through the row sums")
