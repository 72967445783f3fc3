"""Block-by-block paged attention: one (m, l, o) partial per group of blocks, merged as they stream by.

For logical blocks j = 0, c, 2c, ... the kernel reads physical blocks block_tables[:, j:j+c] straight
from the pool, scores them, masks slots past seq_lens[b] (and above the causal diagonal), and merges
the partial into the running one; K/V are never rearranged into a contiguous (B, Hkv, N, d) buffer:
scores and products are computed per block, in the pool's own block-major layout.  c = 1 is the
PagedAttention V1 loop (one block per step); c = 512 / block_size is V2's split into 512-token
partitions whose partials are reduced at the end.  Invariant: the running partial is exact softmax
attention over the keys seen so far.  Kwon et al. 2023, Sec. 4.1; merge: Milakov & Gimelshein 2018.
"""

import torch

from llm_inference_harness.contracts.paged_attention import check_inputs, key_mask
from llm_inference_harness.engine.registry import register
from llm_inference_harness.numerics.online_softmax import Partial, accumulator_dtype, finalize, identity, merge


def blockwise_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None,
                              partition_tokens=None):
    scale = check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale, causal)
    if q.numel() == 0:  # B, H or Nq is 0: seq_lens.max() below has nothing to reduce
        return torch.zeros_like(q)
    (B, H, Nq, d), (_, Hkv, bs, _) = q.shape, k_cache.shape
    acc_t = accumulator_dtype(q.dtype)
    c = max(1, (partition_tokens or bs) // bs)  # blocks per step
    G = H // Hkv
    qg = q.reshape(B, Hkv, G * Nq, d).to(acc_t) * scale  # (B, Hkv, G*Nq, d): head h reads kv head h // G
    total = identity((B, Hkv, G, Nq), d, dtype=acc_t, device=q.device)
    used_blocks = -(-int(seq_lens.max()) // bs)  # table entries past every sequence's end are padding
    for j in range(0, used_blocks, c):
        ids = block_tables[:, j:min(j + c, used_blocks)]  # (B, c)
        n = ids.shape[1] * bs
        k = k_cache.index_select(0, ids.reshape(-1)).view(B, -1, Hkv, bs, d).to(acc_t)  # (B, c, Hkv, bs, d)
        v = v_cache.index_select(0, ids.reshape(-1)).view(B, -1, Hkv, bs, d).to(acc_t)  # block-major, as stored
        ok = key_mask(seq_lens, Nq, n, causal, offset=j * bs)  # (B, 1, 1, Nq|1, c*bs)
        v.masked_fill_(~ok.any(dim=3).reshape(B, -1, 1, bs, 1), 0)  # our own copy: garbage slots -> 0
        s = qg[:, None] @ k.transpose(-1, -2)  # (B, c, Hkv, G*Nq, bs): every block scored where it lies
        s = s.reshape(B, -1, Hkv, G, Nq, bs).permute(0, 2, 3, 4, 1, 5).reshape(B, Hkv, G, Nq, n)
        s = s.masked_fill(~ok, float("-inf"))  # (B, Hkv, G, Nq, c*bs)
        m = s.amax(dim=-1)  # (B, Hkv, G, Nq): the partial of this group of blocks (as merge.partial)
        p = torch.exp(s - torch.where(torch.isfinite(m), m, 0)[..., None])  # (B, Hkv, G, Nq, c*bs)
        p_blocks = p.reshape(B, Hkv, G * Nq, -1, bs).permute(0, 3, 1, 2, 4)  # (B, c, Hkv, G*Nq, bs)
        acc = (p_blocks @ v).sum(dim=1).reshape(B, Hkv, G, Nq, d)  # per-block products, summed over blocks
        total = merge(total, Partial(m, p.sum(dim=-1), acc))
    return finalize(total).to(q.dtype).reshape(B, H, Nq, d)  # (B, H, Nq, d)


register("paged_attention", "blockwise", devices=("cpu", "cuda"), cite="Kwon et al. 2023, Sec. 4.1 (V1 loop)",
         caps={"partition_tokens": None, "tiled": True})(
    lambda q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None: blockwise_paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, causal=causal, scale=scale))
register("paged_attention", "partitioned_512", devices=("cpu", "cuda"),
         cite="vLLM PagedAttention V2 (512-token partitions); Kwon et al. 2023, Sec. 4.1",
         caps={"partition_tokens": 512, "tiled": True})(
    lambda q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None: blockwise_paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, causal=causal, scale=scale, partition_tokens=512))
