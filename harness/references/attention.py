"""Float64 oracles of attention and the plain computations that earn its tolerance."""

from __future__ import annotations

import math

import torch

from harness.contracts.attention import causal_allowed, check_inputs


def attention64(q, k, v, *, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v in float64, straight from the definition; masked-out rows give 0."""
    scale = check_inputs(q, k, v, scale, causal)
    q, k, v = q.double(), k.double(), v.double()
    s = _scores(q, k, scale, causal)  # (B, Hkv, G, Nq, Nk)
    return (_softmax_rows(s) @ v[:, :, None]).reshape(q.shape)  # (B, H, Nq, d)


PLAIN_ORDERS = 4  # operation orders of attention_plain


def attention_plain(q, k, v, *, causal: bool = False, scale: float | None = None) -> list[torch.Tensor]:
    """The 'plain computations' that earn tolerances: the formula carried out in the inputs' own dtype
    in four mathematically identical operation orders (d summed in reverse; q scaled before the
    product; d split in two halves; base-2 scores s * log2(e) and exp2, as FlashAttention-2's kernels
    compute them, which rounds every score once more), normalizing before or after the product with v.
    The largest of their distances from the reference is an honest sample of that dtype's rounding
    error: never the zero that re-running the reference's own order gives in float64, and not one
    lucky draw either."""
    scale = check_inputs(q, k, v, scale, causal)
    h = q.shape[-1] // 2
    orders = [
        (_scores(q.flip(-1), k.flip(-1), scale, causal), False, torch.exp),
        (_scores(q * scale, k, 1.0, causal), True, torch.exp),
        (_scores(q[..., :h], k[..., :h], scale, False) + _scores(q[..., h:], k[..., h:], scale, causal), False,
         torch.exp),
        (_scores(q, k, scale * math.log2(math.e), causal), False, torch.exp2),
    ]
    return [_softmax_v(s, v, normalize_first, exp) for s, normalize_first, exp in orders]


def attention_score_conditioning(q, k, v, *, causal: bool = False, scale: float | None = None) -> float:
    """First-order bound on the output error that rounding the scores alone causes in q's dtype.

    A dot product of length d carries |ds_ij| <= gamma_d * scale * sum_c |q_ic k_jc| with
    gamma_d = d u / (1 - d u) (Higham, Accuracy and Stability, Thm 3.5), plus u |s_ij| for the
    scaling.  Softmax turns it into do_i = sum_j p_ij ds_ij (v_j - o_i); the factor e^(2 max|ds|)
    covers the second-order terms.  At logits of 1e3-1e4 this term, not the arithmetic after it,
    dominates every correct kernel's error, and it differs from draw to draw of the operation order.
    Any weights give a convex combination of the visible v_j, so max_j |v_j - o_i| caps the bound
    where e^(2 max|ds|) overflows (low precision at huge logits), and one visible key gives 0.
    """
    scale = check_inputs(q, k, v, scale, causal)
    u = torch.finfo(q.dtype).eps / 2
    d = q.shape[-1]
    gamma = d * u / (1 - d * u)
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = _scores(q64, k64, scale, causal)  # (B, Hkv, G, Nq, Nk)
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
    return torch.where(first_order > 0, first_order * growth, 0).minimum(hull).max().item()


def _softmax_rows(s: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim; a row that sees no key (all -inf) is 0, as the contract says.  Not
    nan_to_num: a NaN that came from the inputs stays NaN, never a silent 0."""
    return torch.where((s == float("-inf")).all(dim=-1, keepdim=True), 0.0, torch.softmax(s, dim=-1))


def _softmax_v(s: torch.Tensor, v: torch.Tensor, normalize_first: bool, exp=torch.exp) -> torch.Tensor:
    m = s.amax(dim=-1, keepdim=True)
    p = exp(s - torch.where(torch.isfinite(m), m, 0))  # (B, Hkv, G, Nq, Nk)
    l = p.sum(dim=-1, keepdim=True)  # noqa: E741
    l = torch.where(l > 0, l, 1)  # noqa: E741 - rows that see no key stay 0
    out = (p / l) @ v[:, :, None] if normalize_first else (p @ v[:, :, None]) / l  # (B, Hkv, G, Nq, d)
    B, Hkv, G, Nq, d = out.shape
    return out.reshape(B, Hkv * G, Nq, d)  # (B, H, Nq, d)


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d): query head h reads kv head h // G
    s = (qg @ k[:, :, None].transpose(-1, -2)) * scale  # (B, Hkv, G, Nq, Nk)
    return s.masked_fill(~causal_allowed(Nq, Nk, device=q.device), float("-inf")) if causal else s


def attention_lse64(q, k, v, *, causal: bool = False, scale: float | None = None):
    """(o, L) in float64: the forward output and L_i = logsumexp_j of the scaled, masked scores (-inf: no key)."""
    scale = check_inputs(q, k, v, scale, causal)
    s = _scores(q.double(), k.double(), scale, causal)  # (B, Hkv, G, Nq, Nk)
    return attention64(q, k, v, causal=causal, scale=scale), torch.logsumexp(s, dim=-1).reshape(q.shape[:-1])


def attention_lse_plain(q, k, v, *, causal: bool = False, scale: float | None = None) -> list[torch.Tensor]:
    """L carried out in the inputs' own dtype, in the four score orders of `attention_plain`."""
    scale = check_inputs(q, k, v, scale, causal)
    h = q.shape[-1] // 2
    orders = [_scores(q.flip(-1), k.flip(-1), scale, causal), _scores(q * scale, k, 1.0, causal),
              _scores(q[..., :h], k[..., :h], scale, False) + _scores(q[..., h:], k[..., h:], scale, causal)]
    s2 = _scores(q, k, scale * math.log2(math.e), causal)  # base 2: L = ln 2 * (m2 + log2 sum 2^(s2 - m2))
    m2 = s2.amax(dim=-1, keepdim=True)
    m2 = torch.where(torch.isfinite(m2), m2, 0)  # rows that see no key: log2(0) = -inf below
    base2 = (torch.exp2(s2 - m2).sum(dim=-1, keepdim=True).log2() + m2) * math.log(2)
    return [torch.logsumexp(s, dim=-1).reshape(q.shape[:-1]) for s in orders] + [base2.reshape(q.shape[:-1])]
