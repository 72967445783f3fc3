"""Block-by-block paged attention: one (m, l, o) partial per group of blocks, merged as they stream by.

For logical blocks j = 0, c, 2c, ... the kernel reads physical blocks block_tables[:, j:j+c] straight
from the pool, scores them, masks slots past seq_lens[b] (and above the causal diagonal), and merges
the partial into the running one; K/V are never copied into a contiguous buffer.  c = 1 is the
PagedAttention V1 loop (one block per step); c = 512 / block_size is V2's split into 512-token
partitions whose partials are reduced at the end.  Invariant: the running partial is exact softmax
attention over the keys seen so far.  Kwon et al. 2023, Sec. 4.1; merge: Milakov & Gimelshein 2018.
"""

import torch

from harness.contracts.paged_attention import check_inputs, key_mask
from harness.registry import register
from impls.attention.merge import accumulator_dtype, finalize, identity, merge, partial


def blockwise_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None,
                              partition_tokens=None):
    scale = check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale)
    (B, H, Nq, d), (_, Hkv, bs, _) = q.shape, k_cache.shape
    acc_t = accumulator_dtype(q.dtype)
    c = max(1, (partition_tokens or bs) // bs)  # blocks per step
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d).to(acc_t) * scale  # (B, Hkv, G, Nq, d)
    total = identity(qg.shape[:-1], d, dtype=acc_t, device=q.device)
    used_blocks = -(-int(seq_lens.max()) // bs)  # table entries past every sequence's end are padding
    for j in range(0, used_blocks, c):
        ids = block_tables[:, j:min(j + c, used_blocks)]  # (B, c)
        k = k_cache[ids].permute(0, 2, 1, 3, 4).flatten(2, 3).to(acc_t)  # (B, Hkv, c*bs, d)
        v = v_cache[ids].permute(0, 2, 1, 3, 4).flatten(2, 3).to(acc_t)
        ok = key_mask(seq_lens, Nq, k.shape[2], causal, offset=j * bs)  # (B, 1, 1, Nq|1, c*bs)
        s = (qg @ k[:, :, None].transpose(-1, -2)).masked_fill(~ok, float("-inf"))  # (B, Hkv, G, Nq, c*bs)
        v = torch.where(ok.any(dim=3)[..., None], v[:, :, None], 0)  # (B, Hkv, 1, c*bs, d): garbage -> 0
        total = merge(total, partial(s, v))
    return finalize(total).to(q.dtype).reshape(B, H, Nq, d)  # (B, H, Nq, d)


register("paged_attention", "blockwise", devices=("cpu", "cuda"), cite="Kwon et al. 2023, Sec. 4.1 (V1 loop)",
         caps={"partition_tokens": None})(
    lambda q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None: blockwise_paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, causal=causal, scale=scale))
register("paged_attention", "partitioned_512", devices=("cpu", "cuda"),
         cite="vLLM PagedAttention V2 (512-token partitions); Kwon et al. 2023, Sec. 4.1",
         caps={"partition_tokens": 512})(
    lambda q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None: blockwise_paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, causal=causal, scale=scale, partition_tokens=512))
