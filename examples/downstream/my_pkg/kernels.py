"""Exact attention over key blocks with an online softmax (FlashAttention's recurrence, Dao et al. 2022, Alg. 1),
in plain torch: the kernel this example project ships and checks against llm-inference-harness's attention contract
in its CI.  Only its `declare` and the input check come from the harness.  It holds one block of scores per head
at a time, never the (Nq, Nk) matrix: it declares ``tiled``, and has no limit on the number of keys."""

import torch

from llm_inference_harness import declare
from llm_inference_harness.contracts.attention import check_inputs

BLOCK = 64  # keys per block


@declare(dtypes=("float32", "float64"), devices=("cpu",), caps={"tiled": True})
def attention(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)  # ValueError/TypeError naming the argument on bad input
    B, H, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, Nk, d): query head h reads kv head h // (H // Hkv)
    v = v.repeat_interleave(H // Hkv, dim=1)
    m = torch.full((B, H, Nq, 1), float("-inf"), dtype=q.dtype)  # running max of each row's scores
    total = torch.zeros((B, H, Nq, 1), dtype=q.dtype)  # running sum of exp(score - m)
    o = torch.zeros((B, H, Nq, v.shape[-1]), dtype=q.dtype)  # running sum of exp(score - m) v
    i = torch.arange(Nq)[:, None]
    for start in range(0, Nk, BLOCK):
        s = q @ k[:, :, start:start + BLOCK].transpose(-1, -2) * scale  # (B, H, Nq, block)
        if causal:  # bottom-right alignment: query i sees key j iff j <= i + Nk - Nq
            j = torch.arange(start, start + s.shape[-1])[None, :]
            s = s.masked_fill(j > i + Nk - Nq, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        safe = torch.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet stays at 0
        p = torch.exp(s - safe)
        rescale = torch.exp(m - safe)
        total = total * rescale + p.sum(dim=-1, keepdim=True)
        o = o * rescale + p @ v[:, :, start:start + BLOCK]
        m = m_new
    seen = total > 0  # a row that sees no key stays 0 (a NaN input stays NaN)
    return torch.where(seen, o / torch.where(seen, total, 1.0), o)
