"""Float64 oracles of attention and the plain computations that earn its tolerance."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs, check_scores_budget, score_dtype


def attention64(q, k, v, *, causal: bool = False, scale: float | None = None,
                align: str = "bottom_right") -> torch.Tensor:
    """softmax(q k^T * scale) v in float64, straight from the definition; masked-out rows give 0.  ``align``: the
    causal mask's alignment, the contract's bottom_right or a declared top_left (every function here takes it)."""
    scale = check_inputs(q, k, v, scale, causal)
    check_scores_budget("attention reference", q, k.shape[2], copies=2, dtype=torch.float64)
    q, k, v = q.double(), k.double(), v.double()
    s = _scores(q, k, scale, causal, align)  # (B, Hkv, G, Nq, Nk)
    return (_softmax_rows(s) @ v[:, :, None]).reshape(q.shape)  # (B, H, Nq, d)


PLAIN_ORDERS = 6  # operation orders of attention_plain
LSE_PARTITION = 32  # keys per partition of the LSE-merged plain order (split-K decoding's smallest split)


def attention_plain(q, k, v, *, causal: bool = False, scale: float | None = None,
                    scores_in: torch.dtype | None = None, align: str = "bottom_right") -> list[torch.Tensor]:
    """The 'plain computations' that earn tolerances: the formula carried out in the inputs' own dtype
    in six mathematically identical operation orders.  Four divide by the row sum: d summed in reverse;
    q scaled before the product (normalizing before the product with v); d split in two halves; base-2
    scores s * log2(e) and exp2, as FlashAttention-2's kernels compute them.  Two normalize by a
    logsumexp instead, as every kernel that returns L does: P = exp(S - L) with L = m + log l and no
    division (FlashAttention-2's backward form), and partitions of LSE_PARTITION keys normalized on their
    own and merged with weights e^(lse_p - lse), not renormalized (split-KV combine, FlashInfer's merge);
their logsumexps are held in float32 for half inputs, as the L a forward returns is.
    The largest of their distances from the reference is an honest sample of that dtype's rounding
    error: never the zero that re-running the reference's own order gives in float64, and not one
    lucky draw either.

    ``scores_in``: the dtype scores and softmax are carried in, P rounded to q's dtype before the
    product with v and the output at the end -- how a fused kernel computes half-precision attention
    (float32 scores).  The properties at logits past ~88 pass score_dtype(q.dtype): there, scores
    rounded to bfloat16 lose the logits' integer part and float16's q.k overflows, so a plain
    computation in the inputs' own precision earns no bound at all."""
    scale = check_inputs(q, k, v, scale, causal)
    T = q.dtype
    if scores_in is not None:
        q, k = q.to(scores_in), k.to(scores_in)  # exact: a wider float holds every value of the narrower one
    h = q.shape[-1] // 2
    divided = [
        (_scores(q.flip(-1), k.flip(-1), scale, causal, align), False, torch.exp),
        (_scores(q * scale, k, 1.0, causal, align), True, torch.exp),
        (_scores(q[..., :h], k[..., :h], scale, False) + _scores(q[..., h:], k[..., h:], scale, causal, align), False,
         torch.exp),
        (_scores(q, k, scale * math.log2(math.e), causal, align), False, torch.exp2),
    ]
    outs = [_softmax_v(s, v, normalize_first, exp, T) for s, normalize_first, exp in divided]
    wide = score_dtype(T)  # a logsumexp is held in float32 at least: the L a forward returns is float32 or float64
    outs += [_lse_normalized_v(_scores(q, k, scale, causal, align).to(wide), v, T),
             _lse_merged_v(_scores(q * scale, k, 1.0, causal, align).to(wide), v, T)]
    return [_heads(o).to(T) for o in outs]


def large_logit_yardstick(q, k, v, *, causal: bool = False, scale: float | None = None,
                          align: str = "bottom_right"):
    """(plains, conditioning) that earn the bound at logits past ~88: the plain computations with scores in
    score_dtype(q.dtype), and the rounding the scores and subtracted logsumexps cost there."""
    return (attention_plain(q, k, v, causal=causal, scale=scale, scores_in=score_dtype(q.dtype), align=align),
            attention_score_conditioning(q, k, v, causal=causal, scale=scale, align=align))


def attention_score_conditioning(q, k, v, *, causal: bool = False, scale: float | None = None,
                                 align: str = "bottom_right") -> float:
    """First-order bound on the output error that rounding the scores, and the logsumexps subtracted
    from them, causes at large logits; scores carried in score_dtype(q.dtype) (float32 for half inputs).

    Scores: a dot product of length d carries |ds_ij| <= gamma_d * scale * sum_c |q_ic k_jc| with
    gamma_d = d u / (1 - d u) (Higham, Accuracy and Stability, Thm 3.5), plus u |s_ij| for the
    scaling.  Softmax turns it into do_i = sum_j p_ij ds_ij (v_j - o_i); the factor e^(2 max|ds|)
    covers the second-order terms.  Any weights give a convex combination of the visible v_j, so
    max_j |v_j - o_i| caps this term where e^(2 max|ds|) overflows, and one visible key gives 0.

    Normalizers: a kernel that subtracts a logsumexp c = m + log l computed in floats instead of
    dividing by l (P = exp(S - L); partitions (o_p, lse_p) merged with weights e^(lse_p - lse)) does
    not renormalize, so the rounding of c reaches every weight it scales, unlike a common score error.
    Rounding m + log l to the nearest float errs by at most min(u |c|, c - m): the conditioning |c| eps
    of exp(s - c), which vanishes where one key dominates (c = m exactly).  For key j, a partition's
    lse_p lies in [s_j, L], so it errs by r_ij = min(u max(|s_ij|, |L_i|), L_i - s_ij, log n_i)
    (n_i visible keys); lse = logsumexp_p lse_p inherits sum_j p_ij r_ij and adds min(u |L_i|,
    L_i - max_j s_ij); the subtractions s - lse_p, lse_p - lse and those inside the logsumexp add
    3 u (L_i - s_ij).  The weights p_ij (1 + rho_ij) then move o_i by sum_j p_ij rho_ij |v_j| (times
    e^(max rho) for higher orders).  This admits one level of partitions under the total (split-K,
    paged V2); the lse rounding of a deeper tree of merges is not covered.  Score errors of a P
    recomputed in a different order from the L it is normalized by are not covered either: the
    forward computes each score once (or recomputes it bit for bit).
    """
    scale = check_inputs(q, k, v, scale, causal)
    u = torch.finfo(score_dtype(q.dtype)).eps / 2
    d = q.shape[-1]
    gamma = d * u / (1 - d * u)
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = _scores(q64, k64, scale, causal, align)  # (B, Hkv, G, Nq, Nk)
    ds = gamma * abs(scale) * _scores(q64.abs(), k64.abs(), 1.0, False) + u * s.abs().nan_to_num(0, 0, 0)
    p = _softmax_rows(s)
    o = p @ v64[:, :, None]  # (B, Hkv, G, Nq, d)
    spread = (v64[:, :, None, None] - o[..., None, :]).abs()  # (B, Hkv, G, Nq, Nk, d): |v_j - o_i|
    first_order = ((p * ds)[..., None] * spread).sum(dim=-2)  # (B, Hkv, G, Nq, d)
    if not first_order.numel():
        return 0.0
    worst = ds.masked_fill(p == 0, 0).max().item()
    growth = torch.tensor(2 * worst, dtype=torch.float64).exp()  # inf past e^709
    hull = spread.masked_fill(~torch.isfinite(s)[..., None], 0).amax(dim=-2)  # (B, Hkv, G, Nq, d)
    scores = torch.where(first_order > 0, first_order * growth, 0).minimum(hull)
    return (scores + _normalizer_rounding(s, p, v64, u)).max().item()


def _normalizer_rounding(s: torch.Tensor, p: torch.Tensor, v: torch.Tensor, u: float) -> torch.Tensor:
    """sum_j p_ij rho_ij |v_j| (B, Hkv, G, Nq, d): what rounding the logsumexps a kernel subtracts costs
    (attention_score_conditioning's second part)."""
    seen = torch.isfinite(s)  # (B, Hkv, G, Nq, Nk)
    L = torch.logsumexp(s, dim=-1, keepdim=True)  # (B, Hkv, G, Nq, 1); -inf on rows that see no key
    sees = torch.isfinite(L)
    L = torch.where(sees, L, 0)
    gap = torch.where(seen, L - s, 0).clamp(min=0)  # L - s_j >= 0 on visible keys
    n = seen.sum(dim=-1, keepdim=True).clamp(min=1).double()
    r = torch.minimum(torch.minimum(u * torch.maximum(s.abs(), L.abs()), gap), n.log()).masked_fill(~seen, 0)
    top_gap = torch.where(seen, gap, float("inf")).amin(dim=-1, keepdim=True)  # L - max_j s_j
    r_total = torch.where(sees, torch.minimum(u * L.abs(), top_gap), 0)
    rho = (r + (p * r).sum(dim=-1, keepdim=True) + r_total + 3 * u * gap).masked_fill(~seen, 0)
    growth = rho.max().exp() if rho.numel() else 1.0
    return ((p * rho) @ v.abs()[:, :, None]) * growth  # (B, Hkv, G, Nq, d)


def _softmax_rows(s: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim; a row that sees no key (all -inf) is 0, as the contract says.  Not
    nan_to_num: a NaN that came from the inputs stays NaN, never a silent 0."""
    return torch.where((s == float("-inf")).all(dim=-1, keepdim=True), 0.0, torch.softmax(s, dim=-1))


def _softmax_v(s: torch.Tensor, v: torch.Tensor, normalize_first: bool, exp=torch.exp,
               p_dtype: torch.dtype | None = None) -> torch.Tensor:
    """softmax(s) v, (B, Hkv, G, Nq, d), divided by the row sum; P rounded to ``p_dtype`` before the
    product with v (a no-op when it is s's dtype)."""
    m = s.amax(dim=-1, keepdim=True)
    p = exp(s - torch.where(torch.isfinite(m), m, 0))  # (B, Hkv, G, Nq, Nk)
    l = p.sum(dim=-1, keepdim=True)  # noqa: E741
    l = torch.where(l > 0, l, 1)  # noqa: E741 - rows that see no key stay 0
    p, v = _rounded(p, p_dtype), v.to(s.dtype)[:, :, None]  # (B, Hkv, 1, Nk, d)
    return (p / l) @ v if normalize_first else (p @ v) / l  # (B, Hkv, G, Nq, d)


def _lse_normalized_v(s: torch.Tensor, v: torch.Tensor, p_dtype: torch.dtype) -> torch.Tensor:
    """exp(S - L) v with L = m + log l computed from the same S: no division (B, Hkv, G, Nq, d)."""
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0)
    L = m + torch.exp(s - m).sum(dim=-1, keepdim=True).log()  # (B, Hkv, G, Nq, 1); -inf: no key
    p = torch.exp(s - torch.where(torch.isfinite(L), L, 0))  # exp(-inf) = 0 on hidden keys
    return _rounded(p, p_dtype) @ v.to(s.dtype)[:, :, None]


def _lse_merged_v(s: torch.Tensor, v: torch.Tensor, p_dtype: torch.dtype) -> torch.Tensor:
    """Partitions of LSE_PARTITION keys, each (o_p = its softmax average, lse_p), merged as
    sum_p e^(lse_p - lse) o_p with lse = logsumexp_p lse_p and no renormalization (B, Hkv, G, Nq, d)."""
    (B, Hkv, G, Nq, Nk), d, S = s.shape, v.shape[-1], LSE_PARTITION
    P = max(1, -(-Nk // S))
    sp = F.pad(s, (0, P * S - Nk), value=float("-inf")).reshape(B, Hkv, G, Nq, P, S)  # (B, Hkv, G, Nq, P, S)
    vp = F.pad(v.to(s.dtype), (0, 0, 0, P * S - Nk)).reshape(B, Hkv, P, S, d)  # (B, Hkv, P, S, d)
    m = sp.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0)  # (B, Hkv, G, Nq, P, 1)
    e = torch.exp(sp - m)  # (B, Hkv, G, Nq, P, S)
    l = e.sum(dim=-1, keepdim=True)  # noqa: E741
    ep = _rounded(e, p_dtype).permute(0, 1, 4, 2, 3, 5).reshape(B, Hkv, P, G * Nq, S)  # (B, Hkv, P, G Nq, S)
    pv = (ep @ vp).reshape(B, Hkv, P, G, Nq, d).permute(0, 1, 3, 4, 2, 5)  # (B, Hkv, G, Nq, P, d)
    o = pv / torch.where(l > 0, l, 1)  # (B, Hkv, G, Nq, P, d)
    lse = (m + l.log())[..., 0]  # (B, Hkv, G, Nq, P); -inf for a partition that sees no key
    total = torch.logsumexp(lse, dim=-1, keepdim=True)  # (B, Hkv, G, Nq, 1)
    w = torch.exp(lse - torch.where(torch.isfinite(total), total, 0))  # 0 for partitions that see nothing
    return (w[..., None] * o).sum(dim=-2)  # (B, Hkv, G, Nq, d)


def _rounded(p: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """p rounded to ``dtype`` and carried on in its own dtype (FlashAttention casts P before P V)."""
    return p if dtype is None or dtype == p.dtype else p.to(dtype).to(p.dtype)


def _heads(out: torch.Tensor) -> torch.Tensor:
    B, Hkv, G, Nq, d = out.shape
    return out.reshape(B, Hkv * G, Nq, d)  # (B, H, Nq, d)


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool,
            align: str = "bottom_right") -> torch.Tensor:
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d): query head h reads kv head h // G
    s = (qg @ k[:, :, None].transpose(-1, -2)) * scale  # (B, Hkv, G, Nq, Nk)
    return s.masked_fill(~causal_allowed(Nq, Nk, device=q.device, align=align), float("-inf")) if causal else s


def attention_lse64(q, k, v, *, causal: bool = False, scale: float | None = None,
                    align: str = "bottom_right"):
    """(o, L) in float64: the forward output and L_i = logsumexp_j of the scaled, masked scores (-inf: no key)."""
    scale = check_inputs(q, k, v, scale, causal)
    s = _scores(q.double(), k.double(), scale, causal, align)  # (B, Hkv, G, Nq, Nk)
    o = attention64(q, k, v, causal=causal, scale=scale, align=align)
    return o, torch.logsumexp(s, dim=-1).reshape(q.shape[:-1])


def attention_lse_plain(q, k, v, *, causal: bool = False, scale: float | None = None,
                        align: str = "bottom_right") -> list[torch.Tensor]:
    """L carried out in the inputs' own dtype, in the four score orders of `attention_plain`."""
    scale = check_inputs(q, k, v, scale, causal)
    h = q.shape[-1] // 2
    orders = [_scores(q.flip(-1), k.flip(-1), scale, causal, align), _scores(q * scale, k, 1.0, causal, align),
              _scores(q[..., :h], k[..., :h], scale, False) + _scores(q[..., h:], k[..., h:], scale, causal, align)]
    s2 = _scores(q, k, scale * math.log2(math.e), causal, align)  # base 2: L = ln 2 * (m2 + log2 sum 2^(s2 - m2))
    m2 = s2.amax(dim=-1, keepdim=True)
    m2 = torch.where(torch.isfinite(m2), m2, 0)  # rows that see no key: log2(0) = -inf below
    base2 = (torch.exp2(s2 - m2).sum(dim=-1, keepdim=True).log2() + m2) * math.log(2)
    return [torch.logsumexp(s, dim=-1).reshape(q.shape[:-1]) for s in orders] + [base2.reshape(q.shape[:-1])]


def attention_rows(q, k, v, rows: torch.Tensor, *, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 truth and the plain result in q's dtype of the query ``rows`` of attention(q, k, v) (default
    scale, bottom-right causal alignment): a benchmark-sized output checked row by row without its whole score
    matrix in float64."""
    Nq, Nk = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    visible = torch.arange(Nk)[None, :] <= rows[:, None] + Nk - Nq if causal else torch.ones(len(rows), Nk,
                                                                                               dtype=torch.bool)

    def computed(dtype: torch.dtype) -> torch.Tensor:
        qs = q[:, :, rows].cpu().to(dtype)  # (B, H, R, d)
        ks, vs = (t.cpu().to(dtype).repeat_interleave(group, dim=1) for t in (k, v))  # (B, H, Nk, d)
        s = (qs @ ks.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, H, R, Nk)
        p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)
        return torch.where(visible.any(-1, keepdim=True), p, 0) @ vs  # (B, H, R, d)

    return computed(torch.float64), computed(q.dtype)
