"""Correct attention formulations that normalize by a logsumexp instead of dividing by the row sum.

Fixtures of tests/test_attention_formulations.py: each is exact in real arithmetic, and each is how a real
kernel computes, so the earned bounds of the properties must admit them in every dtype.
  * `lse_normalized`: L = m + log l first, then P = exp(S - L) and O = P V with no division -- the forward
    of every path that returns L, and how FlashAttention-2's backward recomputes P (Dao 2023, Sec. 3.2).
  * `lse_merged_splitk`: split-K partitions normalized on their own, (o_p, lse_p), merged as
    o = sum_p e^(lse_p - lse) o_p with lse = logsumexp_p lse_p and no renormalization -- FlashAttention's
    split-KV combine kernel, FlashInfer's merge of attention states.
  * `lse_merged_paged`: the same merge over 512-token partitions of a paged KV cache (vLLM V2's shape of
    the work, FlashInfer's merge).
  * `exp2_backward`: the backward with P = 2^(S log2 e - L log2 e), as FlashAttention's Triton kernels.
Half-precision inputs are carried in float32, as every fused kernel does.
"""

from __future__ import annotations

import math

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs, no_work_output
from llm_inference_harness.contracts.attention_backward import check_backward_inputs
from llm_inference_harness.contracts.paged_attention import check_inputs as check_paged_inputs
from llm_inference_harness.contracts.paged_attention import key_mask
from llm_inference_harness.numerics.online_softmax import accumulator_dtype


def _scores(q, k, scale, causal):
    """scale q k^T in the accumulator dtype, masked: (B, Hkv, G, Nq, Nk)."""
    (B, H, Nq, d), (Hkv, Nk) = q.shape, k.shape[1:3]
    acc_t = accumulator_dtype(q.dtype)
    qg = q.to(acc_t).reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d)
    s = qg @ k.to(acc_t)[:, :, None].transpose(-1, -2) * scale  # (B, Hkv, G, Nq, Nk)
    return s.masked_fill(~causal_allowed(Nq, Nk, device=q.device), float("-inf")) if causal else s


def _lse(s):
    """m + log sum e^(s - m) over the last dim; -inf where every score is -inf."""
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0)
    return (m + torch.exp(s - m).sum(dim=-1, keepdim=True).log()).squeeze(-1)


def lse_normalized(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)
    if (empty := no_work_output(q, k.shape[2])) is not None:
        return empty
    s = _scores(q, k, scale, causal)  # (B, Hkv, G, Nq, Nk)
    L = _lse(s)[..., None]  # (B, Hkv, G, Nq, 1)
    p = torch.exp(s - torch.where(torch.isfinite(L), L, 0))  # rows that see no key: exp(-inf) = 0
    return (p @ v.to(s.dtype)[:, :, None]).to(q.dtype).reshape(q.shape)  # (B, H, Nq, d)


def lse_merge(o, lse):
    """o (P, ..., d), lse (P, ...): sum_p e^(lse_p - lse) o_p, lse = logsumexp_p lse_p (no renormalization)."""
    total = torch.logsumexp(lse, dim=0)  # (...)
    w = torch.exp(lse - torch.where(torch.isfinite(total), total, 0))  # (P, ...): 0 for empty partitions
    return (w[..., None] * o).sum(dim=0)


def _partitions(s, v, split):
    """Per-partition (o_p, lse_p) of scores s (..., Nk) and values v (..., Nk, d): (P, ..., d), (P, ...)."""
    outs, lses = [], []
    for j in range(0, s.shape[-1], split):
        sp, vp = s[..., j:j + split], v[..., j:j + split, :]
        lse = _lse(sp)  # (...)
        p = torch.exp(sp - torch.where(torch.isfinite(lse), lse, 0)[..., None])  # normalized in the partition
        outs.append(p @ vp)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def lse_merged_splitk(q, k, v, *, causal=False, scale=None, split=32):
    scale = check_inputs(q, k, v, scale, causal)
    if (empty := no_work_output(q, k.shape[2])) is not None:
        return empty
    s = _scores(q, k, scale, causal)  # (B, Hkv, G, Nq, Nk)
    o, lse = _partitions(s, v.to(s.dtype)[:, :, None], split)
    return lse_merge(o, lse).to(q.dtype).reshape(q.shape)  # (B, H, Nq, d)


def lse_merged_paged(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None, partition=512):
    scale = check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale, causal)
    if q.numel() == 0:
        return torch.zeros_like(q)
    (B, H, Nq, d), (_, Hkv, bs, _) = q.shape, k_cache.shape
    acc_t = accumulator_dtype(q.dtype)
    used = -(-int(seq_lens.max()) // bs)
    ids = block_tables[:, :used]  # (B, used)
    k = k_cache[ids].to(acc_t).permute(0, 2, 1, 3, 4).reshape(B, Hkv, used * bs, d)  # (B, Hkv, Nk, d)
    v = v_cache[ids].to(acc_t).permute(0, 2, 1, 3, 4).reshape(B, Hkv, used * bs, d)
    ok = key_mask(seq_lens, Nq, used * bs, causal)  # (B, 1, 1, Nq|1, Nk)
    v = v.masked_fill(~ok.any(dim=3).reshape(B, 1, -1, 1), 0)[:, :, None]  # (B, Hkv, 1, Nk, d): garbage slots 0
    qg = q.to(acc_t).reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d)
    s = (qg @ k[:, :, None].transpose(-1, -2) * scale).masked_fill(~ok, float("-inf"))  # (B, Hkv, G, Nq, Nk)
    o, lse = _partitions(s, v, partition)
    return lse_merge(o, lse).to(q.dtype).reshape(q.shape)  # (B, H, Nq, d)


def exp2_backward(q, k, v, o, lse, do, *, causal=False, scale=None):
    scale = check_backward_inputs(q, k, v, o, lse, do, scale, causal)
    (B, H, Nq, d), Hkv = q.shape, k.shape[1]
    acc_t = accumulator_dtype(q.dtype)
    qg, og, dog = (t.to(acc_t).reshape(B, Hkv, H // Hkv, Nq, d) for t in (q, o, do))  # (B, Hkv, G, Nq, d)
    kg, vg = k.to(acc_t)[:, :, None], v.to(acc_t)[:, :, None]  # (B, Hkv, 1, Nk, d)
    L2 = lse.to(acc_t).reshape(B, Hkv, H // Hkv, Nq, 1) * math.log2(math.e)  # (B, Hkv, G, Nq, 1): base 2
    s2 = _scores(q, k, scale * math.log2(math.e), causal)  # (B, Hkv, G, Nq, Nk)
    p = torch.exp2(s2 - torch.where(torch.isfinite(L2), L2, 0))
    ds = p * (dog @ vg.transpose(-1, -2) - (dog * og).sum(-1, keepdim=True))  # (B, Hkv, G, Nq, Nk)
    dq = (ds @ kg * scale).reshape(q.shape)  # (B, H, Nq, d)
    dk = (ds.transpose(-1, -2) @ qg).sum(dim=2) * scale  # (B, Hkv, Nk, d)
    dv = (p.transpose(-1, -2) @ dog).sum(dim=2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
