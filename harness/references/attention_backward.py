"""Float64 oracles of the attention backward pass and its plain computations."""

from __future__ import annotations

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs, score_dtype
from llm_inference_harness.references.attention import _scores, _softmax_rows, attention64


def attention_backward64(q, k, v, do, *, causal: bool = False, scale: float | None = None):
    """(dq, dk, dv) in float64 by autograd through `attention64`: the oracle of the backward."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o = attention64(q64, k64, v64, causal=causal, scale=scale)
    return torch.autograd.grad(o, (q64, k64, v64), do.double())


def attention_backward_plain(q, k, v, o, lse, do, *, causal: bool = False, scale: float | None = None,
                             scores_in: torch.dtype | None = None):
    """The plain backward (P, dV = P^T dO, dP = dO V^T, dS = P (dP - D), dQ = dS K, dK = dS^T Q) in the
    inputs' own dtype, in six operation orders.  Five go FlashAttention's way, P = exp(S - L) from the
    forward's L and D = rowsum(dO o O), with every sum over d (scores, dP, D) cut up as the order says:
    reversed, as is, in halves, shuffled, shuffled halves; D's products rounded before the sum (a rowsum) or
    fused into it (a GEMM).  P is never renormalized, so the rounding of S and L reaches it (one visible key:
    P is 1 only up to it), as in every kernel that recomputes P; and where dS = P (dP - D) cancels (one
    visible key: exactly), the error is that of dP - D alone, a quantity whose size varies a lot from order
    to order: five draws of it make the largest a stable measure.  The sixth is the textbook order,
    P = softmax(q scaled first) and D = rowsum(P o dP).  The scale is applied before or after the product
    with K/Q.  Returns a list of (dq, dk, dv): the samples that earn the gradient tolerance.

    ``scores_in``: the dtype everything is carried in, P and dS rounded to the inputs' dtype before their
    products and the gradients at the end, as FlashAttention's backward does for half inputs (float32
    scores); the large-logit property passes score_dtype(q.dtype)."""
    scale = check_inputs(q, k, v, scale, causal)
    T = q.dtype
    if scores_in is not None:
        q, k, v, o, do = (t.to(scores_in) for t in (q, k, v, o, do))
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
            p = torch.exp(s - torch.where(torch.isfinite(L), L, 0)).to(T)
        p = p.to(T).to(q.dtype)  # rounded to the inputs' dtype (a no-op unless scores_in is wider)
        dv = (p.transpose(-1, -2) @ dog).sum(dim=2)  # (B, Hkv, Nk, d): summed over the G query heads
        dp = dot(cut, dog, vg)  # (B, Hkv, G, Nq, Nk)
        if delta == "P.dP":
            D = (p * dp).sum(-1, keepdim=True)  # (B, Hkv, G, Nq, 1)
        elif delta == "GEMM":
            D = sum(x[..., None, :] @ y[..., :, None] for x, y in pieces(cut, dog, og))[..., 0]  # products fused
        else:
            D = sum((x * y).sum(-1, keepdim=True) for x, y in pieces(cut, dog, og))  # products rounded, then summed
        ds = (p * (dp - D)).to(T).to(q.dtype)  # (B, Hkv, G, Nq, Nk), rounded as P is
        scale_first = n % 2 == 0
        ds = ds * scale if scale_first else ds
        dq, dk = ds @ kg, (ds.transpose(-1, -2) @ qg).sum(dim=2)  # (B, Hkv, G, Nq, d), (B, Hkv, Nk, d)
        if not scale_first:
            dq, dk = dq * scale, dk * scale
        grads.append((dq.reshape(q.shape).to(T), dk.to(T), dv.to(T)))
    return grads


def attention_backward_conditioning(q, k, v, lse, do, *, causal: bool = False,
                                    scale: float | None = None) -> tuple[float, float, float]:
    """First-order bounds on the error of (dq, dk, dv) that rounding the recomputed scores and the delivered L
    causes at large logits, where it dominates.  A backward recomputes P_ij = exp(s_ij - L_i): with the score
    error ds_ij of attention_score_conditioning (scores in score_dtype(q.dtype)) and L_i delivered rounded to
    lse's dtype, P_ij carries a relative error rho_ij <= ds_ij + u_L |L_i|, which nothing renormalizes.  Then
    dV_j moves by sum_i P_ij rho_ij |dO_i| (over the group's heads too), dS_ij = P_ij (dP_ij - D_i) by
    P_ij rho_ij |dP_ij - D_i|, and dQ_i, dK_j by |scale| times that error against |K|, |Q|; e^(max rho) covers
    the higher orders.  dP_ij - D_i itself, two dot products of length d that cancel where one key dominates
    (D_i = dO_i . O_i = dP_ij), errs by up to gamma_d (|dO_i| . |v_j| + |dO_i| . |O_i|) (Higham, Thm 3.5) in
    any order of the sums, fused or not: times P_ij |scale| |Q| a logit-sized q magnifies it in dK (and |K| in
    dQ), as the plain orders, exact there for small d, do not show."""
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), Hkv = q.shape, k.shape[1]
    u, u_lse = torch.finfo(score_dtype(q.dtype)).eps / 2, torch.finfo(lse.dtype).eps / 2
    gamma = d * u / (1 - d * u)
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = _scores(q64, k64, scale, causal)  # (B, Hkv, G, Nq, Nk)
    if not s.numel():
        return 0.0, 0.0, 0.0
    p = _softmax_rows(s)
    L = torch.logsumexp(s, dim=-1, keepdim=True)
    ds = gamma * abs(scale) * _scores(q64.abs(), k64.abs(), 1.0, False) + u * s.abs().nan_to_num(0, 0, 0)
    rho = (ds + u_lse * torch.where(torch.isfinite(L), L, 0).abs()).masked_fill(p == 0, 0)
    growth = rho.max().exp().item()
    dog = do.double().reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d)
    dp = dog @ v64[:, :, None].transpose(-1, -2)  # (B, Hkv, G, Nq, Nk)
    D = (dog * (p @ v64[:, :, None])).sum(dim=-1, keepdim=True)  # (B, Hkv, G, Nq, 1)
    w = p * rho
    o_abs = (p @ v64.abs()[:, :, None])  # (B, Hkv, G, Nq, d): >= |O_i| elementwise
    cancel = gamma * (dog.abs() @ v64.abs()[:, :, None].transpose(-1, -2) + (dog.abs() * o_abs).sum(-1, keepdim=True))
    e_ds = w * (dp - D).abs() + p * (1 + rho) * cancel  # (B, Hkv, G, Nq, Nk)
    c_dq = abs(scale) * (e_ds @ k64.abs()[:, :, None])  # (B, Hkv, G, Nq, d)
    c_dk = abs(scale) * (e_ds.transpose(-1, -2) @ q64.abs().reshape(dog.shape)).sum(dim=2)  # (B, Hkv, Nk, d)
    c_dv = (w.transpose(-1, -2) @ dog.abs()).sum(dim=2)  # (B, Hkv, Nk, d)
    return tuple(c.max().item() * growth if c.numel() else 0.0 for c in (c_dq, c_dk, c_dv))


def attention_probs64(q, k, *, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """P = softmax(scale q k^T) in float64, (B, Hkv, G, Nq, Nk); rows that see no key are 0."""
    scale = check_inputs(q, k, k, scale, causal)
    return _softmax_rows(_scores(q.double(), k.double(), scale, causal))
