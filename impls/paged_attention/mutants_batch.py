"""Known-wrong batch-invariant paged attention: kernels that partition a sequence's keys according to its batch.

* v2_for_small_batches: vLLM's choice between its V1 kernel (one pass over a sequence's blocks) and V2
  (512-token partitions reduced at the end) made from the batch (below).
* splits_sized_by_padded_length: FlashAttention-2's split-KV (flash_fwd_splitkv, Flash-Decoding) fixes the
  number of splits and sizes them as ceil(n_blocks / num_splits), n_blocks counted from the batch's
  max_seqlen_k: padding the batch to a longer sequence moves every other sequence's split edges.

vLLM's paged_attention dispatch takes V1 when ``max_seq_len <= 8192 and (max_num_partitions == 1 or
num_seqs * num_heads > 512)``: a short batch of many sequences runs V1, the same sequence in a small batch
V2.  Both are exact in real arithmetic and the float64 reference cannot tell them apart; a sequence's bits
change with the number of other sequences.  Here the partitions hold 16 tokens and the threshold is 8
(sequence x head pairs), so the test sizes cross it.  vLLM csrc/attention, vllm/attention/ops/paged_attn.py.
"""


import torch

from llm_inference_harness.contracts.paged_attention import check_inputs, key_mask
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.paged_attention.gather import gather_kv
from llm_inference_harness.numerics.fixed_order import attention_partial
from llm_inference_harness.numerics.online_softmax import accumulator_dtype, finalize, merge

PARTITION = 16  # tokens per V2 partition
PAIRS = 8  # sequence x head pairs above which V1 runs
SPLITS = 4  # key partitions per sequence, sized from the padded width of the batch


def partitioned(q, k_cache, v_cache, block_tables, seq_lens, causal, scale, size):
    """Exact paged attention over the gathered keys in partitions of ``size(B, H, Nk)`` keys, merged in order
    with the online-softmax rescale; Nk is the padded width, the batch's longest sequence in whole blocks."""
    scale = check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale, causal)
    if q.numel() == 0:
        return torch.zeros_like(q)
    (B, H, Nq, d), dtype = q.shape, q.dtype
    used = -(-int(seq_lens.max()) // k_cache.shape[2])
    k, v = (gather_kv(c, block_tables[:, :used]).to(accumulator_dtype(dtype)) for c in (k_cache, v_cache))
    q, Nk = q.to(k.dtype), k.shape[2]
    visible = key_mask(seq_lens, Nq, Nk, causal)  # (B, 1, 1, Nq|1, Nk)
    n = size(B, H, Nk)
    total = attention_partial(q, k[:, :, :n], v[:, :, :n], visible[..., :n], scale)
    for j0 in range(n, Nk, n):
        total = merge(total, attention_partial(q, k[:, :, j0:j0 + n], v[:, :, j0:j0 + n], visible[..., j0:j0 + n],
                                               scale))
    return finalize(total).reshape(B, H, Nq, d).to(dtype)  # (B, H, Nq, d)


@register("paged_attention", "mutant_v2_for_small_batches", devices=("cpu", "cuda"), mutant=True,
          bug="V1 (one pass) when sequences x heads > 8, else V2's 16-token partitions merged at the end, as "
              "vLLM's dispatch chooses: a sequence's bits depend on how many others share its batch",
          killed_by=("rows_are_batch_invariant",), caps={"batch_invariant": True, "deterministic": True})
def v2_for_small_batches(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None):
    return partitioned(q, k_cache, v_cache, block_tables, seq_lens, causal, scale,
                       lambda B, H, Nk: Nk if B * H > PAIRS else PARTITION)


@register("paged_attention", "mutant_splits_sized_by_padded_length", devices=("cpu", "cuda"), mutant=True,
          bug="cuts every sequence's keys into 4 partitions of ceil(padded width / 4), the padded width being the "
              "batch's longest sequence (FlashAttention-2's split-KV sizes its splits from max_seqlen_k): a "
              "sequence's partition edges, so its bits, move with the longest sequence it is batched with",
          killed_by=("rows_are_batch_invariant",), caps={"batch_invariant": True, "deterministic": True})
def splits_sized_by_padded_length(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None):
    return partitioned(q, k_cache, v_cache, block_tables, seq_lens, causal, scale,
                       lambda B, H, Nk: -(-Nk // SPLITS))
