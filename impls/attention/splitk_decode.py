"""Split-K ("flash decoding") attention: one query (or a few) against a long KV cache.

The keys are cut into P partitions of `split` keys; each partition's partial (m, l, acc) is
computed independently (on a GPU by its own thread block, so a single query still fills the
machine), then the partials are combined by a log2(P)-deep tree of the (m, l, o) merge of
harness/numerics/online_softmax.py.  Invariant: each partial is exact over its own keys, and merging two
disjoint partials gives the partial of their union -- rescaled to the larger max, e^(m_i - m).
Exact for any Nq, but built for decoding: the scores of all partitions exist at once, O(Nq Nk)
per head like the naive kernel, which is nothing at Nq = 1 and wasteful for long prompts.
Dao, Haziza, Massa & Sizov 2023, "Flash-Decoding for long-context inference" (PyTorch blog).
"""

import math

import torch
import torch.nn.functional as F

from llm_inference_harness.contracts.attention import check_inputs, check_scores_budget
from llm_inference_harness.engine.registry import register
from llm_inference_harness.numerics.online_softmax import Partial, accumulator_dtype, finalize, merge, partial


def partition_partials(q, k, v, *, causal, scale, split):
    """One partial per key partition, the partition axis at dim 3: m, l (B, Hkv, G, P, Nq), acc (..., d)."""
    scale = check_inputs(q, k, v, scale, causal)
    check_scores_budget("attention split-K", q, k.shape[2], copies=2)  # every partition's scores at once
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    acc_t, P = accumulator_dtype(q.dtype), max(1, math.ceil(Nk / split))
    kv_shape = (B, Hkv, 1, P, split, d)  # keys padded to P * split, then cut into partitions
    kp = F.pad(k, (0, 0, 0, P * split - Nk)).to(acc_t).reshape(kv_shape)  # (B, Hkv, 1, P, S, d)
    vp = F.pad(v, (0, 0, 0, P * split - Nk)).to(acc_t).reshape(kv_shape)  # (B, Hkv, 1, P, S, d)
    qg = q.reshape(B, Hkv, H // Hkv, 1, Nq, d).to(acc_t) * scale  # (B, Hkv, G, 1, Nq, d)
    s = qg @ kp.transpose(-1, -2)  # (B, Hkv, G, P, Nq, S)
    key = torch.arange(P * split, device=q.device).reshape(P, 1, split)  # (P, 1, S)
    visible = key < Nk  # padding is invisible
    if causal:
        visible = visible & (key <= torch.arange(Nq, device=q.device)[:, None] + Nk - Nq)  # (P, Nq, S)
    return partial(s.masked_fill_(~visible, float("-inf")), vp)


def tree_combine(p: Partial, merge_fn=merge) -> Partial:
    """Merge the partials along dim 3 pairwise, halving the count each round (log2 P rounds)."""
    while p.m.shape[3] > 1:
        half, odd = p.m.shape[3] // 2, p.m.shape[3] % 2
        merged = merge_fn(Partial(*(x[:, :, :, :half] for x in p)), Partial(*(x[:, :, :, half:2 * half] for x in p)))
        leftover = [x[:, :, :, 2 * half:] for x in p]  # the odd one out waits for the next round
        p = Partial(*(torch.cat([x, y], dim=3) if odd else x for x, y in zip(merged, leftover, strict=True)))
    return Partial(*(x[:, :, :, 0] for x in p))


def splitk_attention(q, k, v, *, causal=False, scale=None, split=32):
    out = finalize(tree_combine(partition_partials(q, k, v, causal=causal, scale=scale, split=split)))
    return out.to(q.dtype).reshape(q.shape)  # (B, H, Nq, d)


for _split in (32, 7):
    register(
        "attention", f"splitk_decode_{_split}", devices=("cpu", "cuda"),
        cite="Dao et al. 2023, Flash-Decoding", caps={"split": _split},
    )(lambda q, k, v, *, causal=False, scale=None, _split=_split: splitk_attention(
        q, k, v, causal=causal, scale=scale, split=_split))
