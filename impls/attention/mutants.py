"""Known-wrong attention kernels, each modelled on a real bug. The properties must kill every one.

All share one FA-2-shaped loop (Q blocks outer, K/V blocks inner) with a single bug switched on,
so each differs from a correct tiled kernel by exactly the bug it is named after.
"""

import torch

from harness.contracts.attention import check_inputs
from harness.registry import register

BUGS = {
    "cheating_softmax": "each key block normalized on its own and the block outputs averaged",
    "missing_rescale": "running sum and output not rescaled by e^(m - m') when the max grows",
    "causal_top_left": "causal mask aligned top-left (j <= i) instead of bottom-right when Nq != Nk",
    "causal_one_past_diagonal": "causal mask one key too wide (j <= i + 1, tril's diagonal off by one): each "
                                "row also sees the next token",
    "drops_partial_tile": "the partial last key tile (Nk % Bc keys) is never visited",
    "unscaled_scores": "default scale 1 instead of 1/sqrt(d)",
    "contiguous_strides": "q, k, v read through their data pointers with contiguous strides: heads viewed out of "
                          "a (B, N, H, d) projection are read as garbage",
}
KILLED_BY = {name: ("matches_reference",) for name in BUGS}


def buggy_attention(q, k, v, *, causal=False, scale=None, bug: str, Br=32, Bc=32):
    scale = 1.0 if bug == "unscaled_scores" and scale is None else check_inputs(q, k, v, scale, causal)
    if bug == "contiguous_strides":
        q, k, v = (as_if_contiguous(t) for t in (q, k, v))
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d).double()  # (B, Hkv, G, Nq, d)
    kT, vg = k[:, :, None].transpose(-1, -2).double(), v[:, :, None].double()  # (B,Hkv,1,d,Nk), (B,Hkv,1,Nk,d)
    offset = 0 if bug == "causal_top_left" else Nk - Nq
    k_stop = (Nk // Bc) * Bc if bug == "drops_partial_tile" else Nk
    out = torch.zeros(qg.shape, dtype=torch.float64, device=q.device)
    for i0 in range(0, Nq, Br):
        i1 = min(i0 + Br, Nq)
        m = torch.full((*qg.shape[:3], i1 - i0), float("-inf"), dtype=torch.float64, device=q.device)
        l, acc, blocks = torch.zeros_like(m), torch.zeros_like(qg[..., i0:i1, :]), 0  # noqa: E741
        for j0 in range(0, k_stop, Bc):
            j1 = min(j0 + Bc, Nk)
            s = qg[..., i0:i1, :] @ kT[..., j0:j1] * scale  # (B, Hkv, G, Br, Bc)
            if causal:
                i, j = torch.arange(i0, i1, device=q.device), torch.arange(j0, j1, device=q.device)
                wide = 1 if bug == "causal_one_past_diagonal" else 0
                s = s.masked_fill(~(j[None, :] <= i[:, None] + offset + wide), float("-inf"))  # (Br, Bc) mask
            m_new = torch.maximum(m, s.amax(-1))
            m_safe = torch.where(torch.isfinite(m_new), m_new, 0)
            p = torch.exp(s - m_safe[..., None])
            if bug == "cheating_softmax":  # normalize inside the block, average over blocks
                lb = p.sum(-1, keepdim=True)
                acc = acc + torch.where(lb > 0, p / torch.where(lb > 0, lb, 1), 0) @ vg[..., j0:j1, :]
                blocks += 1
                l = torch.full_like(l, float(blocks))  # noqa: E741
                continue
            alpha = torch.ones_like(m) if bug == "missing_rescale" else torch.exp(m - m_safe)
            l = alpha * l + p.sum(-1)  # noqa: E741
            acc = alpha[..., None] * acc + p @ vg[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = torch.where(l[..., None] > 0, acc / torch.where(l > 0, l, 1)[..., None], 0)
    return out.to(q.dtype).reshape(B, H, Nq, d)  # (B, H, Nq, d)


def as_if_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t's storage from its first element, read with the strides of a contiguous tensor of its shape."""
    return t.as_strided(t.shape, torch.empty(t.shape, device="meta").stride())


for _bug, _what in BUGS.items():
    register("attention", f"mutant_{_bug}", devices=("cpu", "cuda"), mutant=True, bug=_what,
             killed_by=KILLED_BY[_bug])(
        lambda q, k, v, *, causal=False, scale=None, _bug=_bug: buggy_attention(q, k, v, causal=causal,
                                                                                scale=scale, bug=_bug))
