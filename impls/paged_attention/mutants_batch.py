"""Known-wrong batch-invariant paged attention: vLLM's choice between its V1 kernel (one pass over a
sequence's blocks) and V2 (512-token partitions reduced at the end) made from the batch.

vLLM's paged_attention dispatch takes V1 when ``max_seq_len <= 8192 and (max_num_partitions == 1 or
num_seqs * num_heads > 512)``: a short batch of many sequences runs V1, the same sequence in a small batch
V2.  Both are exact in real arithmetic and the float64 reference cannot tell them apart; a sequence's bits
change with the number of other sequences.  Here the partitions hold 16 tokens and the threshold is 8
(sequence x head pairs), so the test sizes cross it.  vLLM csrc/attention, vllm/attention/ops/paged_attn.py.
"""


import torch

from harness.contracts.paged_attention import check_inputs, key_mask
from harness.fixed_order import attention_partial
from harness.online_softmax import accumulator_dtype, finalize, merge
from harness.registry import register
from impls.paged_attention.gather import gather_kv

PARTITION = 16  # tokens per V2 partition
PAIRS = 8  # sequence x head pairs above which V1 runs


@register("paged_attention", "mutant_v2_for_small_batches", devices=("cpu", "cuda"), mutant=True,
          bug="V1 (one pass) when sequences x heads > 8, else V2's 16-token partitions merged at the end, as "
              "vLLM's dispatch chooses: a sequence's bits depend on how many others share its batch",
          killed_by=("rows_are_batch_invariant",), caps={"batch_invariant": True, "deterministic": True})
def v2_for_small_batches(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None):
    scale = check_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale, causal)
    if q.numel() == 0:
        return torch.zeros_like(q)
    (B, H, Nq, d), dtype = q.shape, q.dtype
    used = -(-int(seq_lens.max()) // k_cache.shape[2])
    k, v = (gather_kv(c, block_tables[:, :used]).to(accumulator_dtype(dtype)) for c in (k_cache, v_cache))
    q, Nk = q.to(k.dtype), k.shape[2]
    visible = key_mask(seq_lens, Nq, Nk, causal)  # (B, 1, 1, Nq|1, Nk)
    size = Nk if B * H > PAIRS else PARTITION
    total = attention_partial(q, k[:, :, :size], v[:, :, :size], visible[..., :size], scale)
    for j0 in range(size, Nk, size):
        total = merge(total, attention_partial(q, k[:, :, j0:j0 + size], v[:, :, j0:j0 + size],
                                               visible[..., j0:j0 + size], scale))
    return finalize(total).reshape(B, H, Nq, d).to(dtype)  # (B, H, Nq, d)
