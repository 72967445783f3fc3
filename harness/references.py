"""Float64 oracles, one section per technique. Properties compare against these."""

from __future__ import annotations

import torch

from harness.contracts.attention import causal_allowed, check_inputs


# ---------------------------------------------------------------------------------------------
# attention
def attention64(q, k, v, *, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v in float64, straight from the definition; masked-out rows give 0."""
    scale = check_inputs(q, k, v, scale)
    q, k, v = q.double(), k.double(), v.double()
    s = _scores(q, k, scale, causal)  # (B, Hkv, G, Nq, Nk)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # fully masked rows: softmax gives NaN, contract says 0
    return (p @ v[:, :, None]).reshape(q.shape)  # (B, H, Nq, d)


def attention_plain(q, k, v, *, causal: bool = False, scale: float | None = None) -> list[torch.Tensor]:
    """The 'plain computations' that earn tolerances: the formula carried out in the inputs' own dtype
    in three mathematically identical operation orders (d summed in reverse; q scaled before the
    product; d split in two halves), normalizing before or after the product with v.  The largest of
    their distances from the reference is an honest sample of that dtype's rounding error: never the
    zero that re-running the reference's own order gives in float64, and not one lucky draw either."""
    scale = check_inputs(q, k, v, scale)
    h = q.shape[-1] // 2
    orders = [
        (_scores(q.flip(-1), k.flip(-1), scale, causal), False),
        (_scores(q * scale, k, 1.0, causal), True),
        (_scores(q[..., :h], k[..., :h], scale, False) + _scores(q[..., h:], k[..., h:], scale, causal), False),
    ]
    return [_softmax_v(s, v, normalize_first) for s, normalize_first in orders]


def _softmax_v(s: torch.Tensor, v: torch.Tensor, normalize_first: bool) -> torch.Tensor:
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isfinite(m), m, 0))  # (B, Hkv, G, Nq, Nk)
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


# ---------------------------------------------------------------------------------------------
# attention_backward
def attention_lse64(q, k, v, *, causal: bool = False, scale: float | None = None):
    """(o, L) in float64: the forward output and L_i = logsumexp_j of the scaled, masked scores (-inf: no key)."""
    scale = check_inputs(q, k, v, scale)
    s = _scores(q.double(), k.double(), scale, causal)  # (B, Hkv, G, Nq, Nk)
    return attention64(q, k, v, causal=causal, scale=scale), torch.logsumexp(s, dim=-1).reshape(q.shape[:-1])


def attention_lse_plain(q, k, v, *, causal: bool = False, scale: float | None = None) -> list[torch.Tensor]:
    """L carried out in the inputs' own dtype, in the three score orders of `attention_plain`."""
    scale = check_inputs(q, k, v, scale)
    h = q.shape[-1] // 2
    orders = [_scores(q.flip(-1), k.flip(-1), scale, causal), _scores(q * scale, k, 1.0, causal),
              _scores(q[..., :h], k[..., :h], scale, False) + _scores(q[..., h:], k[..., h:], scale, causal)]
    return [torch.logsumexp(s, dim=-1).reshape(q.shape[:-1]) for s in orders]  # (B, H, Nq)


def attention_backward64(q, k, v, do, *, causal: bool = False, scale: float | None = None):
    """(dq, dk, dv) in float64 by autograd through `attention64`: the oracle of the backward."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o = attention64(q64, k64, v64, causal=causal, scale=scale)
    return torch.autograd.grad(o, (q64, k64, v64), do.double())


def attention_backward_plain(q, k, v, o, do, *, causal: bool = False, scale: float | None = None):
    """The plain backward (P = softmax(S), dV = P^T dO, dP = dO V^T, dS = P (dP - D), dQ = dS K, dK = dS^T Q)
    in the inputs' own dtype, in three operation orders: scores summed over d reversed / with q scaled
    first / in two halves of d; D = rowsum(dO o O) or rowsum(P o dP); the scale applied before or after
    the product with K/Q.  Returns a list of (dq, dk, dv): the samples that earn the gradient tolerance."""
    scale = check_inputs(q, k, v, scale)
    (B, H, Nq, d), Hkv = q.shape, k.shape[1]
    h = d // 2
    qg, og, dog = (t.reshape(B, Hkv, H // Hkv, Nq, d) for t in (q, o, do))  # (B, Hkv, G, Nq, d)
    kg, vg = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, Nk, d)
    orders = [
        (_scores(q.flip(-1), k.flip(-1), scale, causal), "dO.O", True),
        (_scores(q * scale, k, 1.0, causal), "P.dP", False),
        (_scores(q[..., :h], k[..., :h], scale, False) + _scores(q[..., h:], k[..., h:], scale, causal), "dO.O", False),
    ]
    grads = []
    for s, delta_from, scale_first in orders:
        m = s.amax(dim=-1, keepdim=True)
        p = torch.exp(s - torch.where(torch.isfinite(m), m, 0))  # (B, Hkv, G, Nq, Nk)
        l = p.sum(dim=-1, keepdim=True)  # noqa: E741
        p = p / torch.where(l > 0, l, 1)
        dv = (p.transpose(-1, -2) @ dog).sum(dim=2)  # (B, Hkv, Nk, d): summed over the G query heads
        dp = dog @ vg.transpose(-1, -2)  # (B, Hkv, G, Nq, Nk)
        D = (dog * og).sum(-1, keepdim=True) if delta_from == "dO.O" else (p * dp).sum(-1, keepdim=True)
        ds = p * (dp - D)  # (B, Hkv, G, Nq, Nk)
        ds = ds * scale if scale_first else ds
        dq, dk = ds @ kg, (ds.transpose(-1, -2) @ qg).sum(dim=2)  # (B, Hkv, G, Nq, d), (B, Hkv, Nk, d)
        if not scale_first:
            dq, dk = dq * scale, dk * scale
        grads.append((dq.reshape(q.shape), dk, dv))
    return grads


def attention_probs64(q, k, *, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """P = softmax(scale q k^T) in float64, (B, Hkv, G, Nq, Nk); rows that see no key are 0."""
    scale = check_inputs(q, k, k, scale)
    return torch.softmax(_scores(q.double(), k.double(), scale, causal), dim=-1).nan_to_num(0.0)
