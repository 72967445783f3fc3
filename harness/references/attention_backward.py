"""Float64 oracles of the attention backward pass and its plain computations."""

from __future__ import annotations

import torch

from harness.contracts.attention import causal_allowed, check_inputs
from harness.references.attention import _scores, _softmax_rows, attention64


def attention_backward64(q, k, v, do, *, causal: bool = False, scale: float | None = None):
    """(dq, dk, dv) in float64 by autograd through `attention64`: the oracle of the backward."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o = attention64(q64, k64, v64, causal=causal, scale=scale)
    return torch.autograd.grad(o, (q64, k64, v64), do.double())


def attention_backward_plain(q, k, v, o, lse, do, *, causal: bool = False, scale: float | None = None):
    """The plain backward (P, dV = P^T dO, dP = dO V^T, dS = P (dP - D), dQ = dS K, dK = dS^T Q) in the
    inputs' own dtype, in six operation orders.  Five go FlashAttention's way, P = exp(S - L) from the
    forward's L and D = rowsum(dO o O), with every sum over d (scores, dP, D) cut up as the order says:
    reversed, as is, in halves, shuffled, shuffled halves; D's products rounded before the sum (a rowsum) or
    fused into it (a GEMM).  P is never renormalized, so the rounding of S and L reaches it (one visible key:
    P is 1 only up to it), as in every kernel that recomputes P; and where dS = P (dP - D) cancels (one
    visible key: exactly), the error is that of dP - D alone, a quantity whose size varies a lot from order
    to order: five draws of it make the largest a stable measure.  The sixth is the textbook order,
    P = softmax(q scaled first) and D = rowsum(P o dP).  The scale is applied before or after the product
    with K/Q.  Returns a list of (dq, dk, dv): the samples that earn the gradient tolerance."""
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), (Hkv, Nk) = q.shape, k.shape[1:3]
    h = d // 2
    qg, og, dog = (t.reshape(B, Hkv, H // Hkv, Nq, d) for t in (q, o, do))  # (B, Hkv, G, Nq, d)
    kg, vg = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, Nk, d)
    L = lse.reshape(B, Hkv, H // Hkv, Nq, 1)  # (B, Hkv, G, Nq, 1) as delivered: -inf on rows that see no key
    hidden = ~causal_allowed(Nq, Nk, device=q.device) if causal else torch.zeros(Nq, Nk, dtype=torch.bool,
                                                                                  device=q.device)
    perm = torch.randperm(d, generator=torch.Generator().manual_seed(d)).to(q.device)  # a fixed shuffle of d
    cuts = {"reversed": lambda t: [t.flip(-1)], "as is": lambda t: [t], "halves": lambda t: [t[..., :h], t[..., h:]],
            "shuffled": lambda t: [t[..., perm]], "shuffled halves": lambda t: [t[..., perm[:h]], t[..., perm[h:]]]}
    orders = [("reversed", "rowsum"), ("as is", "GEMM"), ("halves", "rowsum"), ("shuffled", "GEMM"),
              ("shuffled halves", "rowsum"), ("as is", "P.dP")]

    def pieces(cut, a, b):  # the matching pieces of d of two tensors
        return zip(cuts[cut](a), cuts[cut](b), strict=True)

    def dot(cut, a, b):  # (.., M, d), (.., N, d) -> (.., M, N), summed over d piece by piece
        return sum(x @ y.transpose(-1, -2) for x, y in pieces(cut, a, b))

    grads = []
    for n, (cut, delta) in enumerate(orders):
        if delta == "P.dP":
            p = _softmax_rows(_scores(q * scale, k, 1.0, causal))  # (B, Hkv, G, Nq, Nk)
        else:  # FlashAttention: P recomputed from L; exp(-inf) = 0 on hidden keys and rows that see none
            s = (dot(cut, qg, kg) * scale).masked_fill(hidden, float("-inf"))  # (B, Hkv, G, Nq, Nk)
            p = torch.exp(s - torch.where(torch.isfinite(L), L, 0)).to(q.dtype)
        dv = (p.transpose(-1, -2) @ dog).sum(dim=2)  # (B, Hkv, Nk, d): summed over the G query heads
        dp = dot(cut, dog, vg)  # (B, Hkv, G, Nq, Nk)
        if delta == "P.dP":
            D = (p * dp).sum(-1, keepdim=True)  # (B, Hkv, G, Nq, 1)
        elif delta == "GEMM":
            D = sum(x[..., None, :] @ y[..., :, None] for x, y in pieces(cut, dog, og))[..., 0]  # products fused
        else:
            D = sum((x * y).sum(-1, keepdim=True) for x, y in pieces(cut, dog, og))  # products rounded, then summed
        ds = p * (dp - D)  # (B, Hkv, G, Nq, Nk)
        scale_first = n % 2 == 0
        ds = ds * scale if scale_first else ds
        dq, dk = ds @ kg, (ds.transpose(-1, -2) @ qg).sum(dim=2)  # (B, Hkv, G, Nq, d), (B, Hkv, Nk, d)
        if not scale_first:
            dq, dk = dq * scale, dk * scale
        grads.append((dq.reshape(q.shape), dk, dv))
    return grads


def attention_probs64(q, k, *, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """P = softmax(scale q k^T) in float64, (B, Hkv, G, Nq, Nk); rows that see no key are 0."""
    scale = check_inputs(q, k, k, scale, causal)
    return _softmax_rows(_scores(q.double(), k.double(), scale, causal))
