"""Known-wrong batch-invariant attention: exact kernels whose reduction order follows the batch or the thread
count, each declaring the capability it breaks, so the batch-invariance properties must kill it.

Both are the fixed-order kernel of impls/attention/batch_invariant.py with one choice made at run time, the
way serving kernels make it: Flash-Decoding splits the keys when batch x heads x query blocks would leave
streaming multiprocessors idle (FlashAttention-2's num_splits_heuristic), and a CPU kernel splits its
reduction over the threads it has.  Every split is exact in real arithmetic -- the partials are merged with
the online-softmax rescale, so the float64 reference cannot tell -- but a row's bits move with it.
"""

import math

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs, no_work_output
from llm_inference_harness.engine.registry import register
from llm_inference_harness.numerics.fixed_order import attention_partial
from llm_inference_harness.numerics.online_softmax import accumulator_dtype, finalize, merge

SMS = 8  # "streaming multiprocessors": fewer (batch x heads x query blocks) than this and the keys are split
QUERY_BLOCK = 64  # query rows per block, as FlashAttention-2 counts its thread blocks
SPLIT = 16  # keys per partition when split


def split_attention(q, k, v, *, causal, scale, partitions):
    """Fixed-order attention over ``partitions(B, H, Nq, Nk)`` contiguous key ranges, merged by the rescale."""
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), Nk, dtype = q.shape, k.shape[2], q.dtype
    if (empty := no_work_output(q, Nk)) is not None:
        return empty
    everything = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    visible = (causal_allowed(Nq, Nk, device=q.device) if causal else everything)[None, None, None]  # (1,1,1,Nq,Nk)
    size = math.ceil(Nk / partitions(B, H, Nq, Nk))
    q, k, v = (t.to(accumulator_dtype(dtype)) for t in (q, k, v))
    total = attention_partial(q, k[:, :, :size], v[:, :, :size], visible[..., :size], scale)
    for j0 in range(size, Nk, size):
        part = attention_partial(q, k[:, :, j0:j0 + size], v[:, :, j0:j0 + size], visible[..., j0:j0 + size], scale)
        total = merge(total, part)
    return finalize(total).reshape(B, H, Nq, d).to(dtype)  # (B, H, Nq, d)


def splits_for_small_batches(B, H, Nq, Nk):
    """num_splits_heuristic: split the keys only while the batch leaves the machine idle."""
    return math.ceil(Nk / SPLIT) if B * H * math.ceil(Nq / QUERY_BLOCK) < SMS else 1


def splits_per_thread(B, H, Nq, Nk):
    """One partition of the keys per intra-op thread (an OpenMP reduction split over the team)."""
    return torch.get_num_threads()


MUTANTS = {
    "splitk_for_small_batches": (splits_for_small_batches, "rows_are_batch_invariant", "splits the keys into "
                                 "16-key partitions when batch x heads x query blocks < 8 (Flash-Decoding's "
                                 "heuristic): a row alone and the same row in a large batch take different orders"),
    "splits_by_thread_count": (splits_per_thread, "same_bits_every_run_and_thread_count", "splits the keys into "
                               "one partition per intra-op thread: the bits change with torch.set_num_threads"),
}
for _name, (_partitions, _killer, _bug) in MUTANTS.items():
    register("attention", f"mutant_{_name}", devices=("cpu", "cuda"), mutant=True, bug=_bug, killed_by=(_killer,),
             caps={"batch_invariant": True, "deterministic": True})(
        lambda q, k, v, *, causal=False, scale=None, _partitions=_partitions: split_attention(
            q, k, v, causal=causal, scale=scale, partitions=_partitions))
