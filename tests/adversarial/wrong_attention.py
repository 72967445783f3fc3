"""The wrong attention every plugin here starts from: it ignores ``causal`` and uses scale 1.  Checked honestly it
fails matches_reference at once; each plugin beside it adds one trick to pass anyway (a file per trick, each
loaded in a process of its own, as `harness check --plugin` loads it)."""

import torch


def wrong(q, k, v, *, causal=False, scale=None):
    group = q.shape[1] // max(k.shape[1], 1)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, Nk, d)
    return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v  # (B, H, Nq, d): no mask, no scale


def correct(q, k, v, *, causal=False, scale=None):
    """What a cheat hands back when it thinks it is watched (a plugin that calls a correct implementation)."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False, scale=scale, enable_gqa=True) \
        if not causal else _causal(q, k, v, scale)


def _causal(q, k, v, scale):
    Nq, Nk = q.shape[2], k.shape[2]
    seen = torch.ones(Nq, Nk, dtype=torch.bool).tril(Nk - Nq)  # bottom-right aligned
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=scale, enable_gqa=True)
    return torch.where(seen.any(-1, keepdim=True), out, 0).nan_to_num(0)
