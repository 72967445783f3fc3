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
