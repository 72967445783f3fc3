"""Known-wrong batch-invariant decoders: the fixed-order decoder of impls/kvcache/batch_invariant.py with a
key reduction that is exact in real arithmetic but cut into partials (merged with the online-softmax
rescale) at places that depend on the batch or on the phase, so only the bits move.

* reorders_rows_by_length: rows are ranked by prompt length, longest first, and packed back to back without
  padding (varlen: a row starts at the cumulative length of the rows ranked before it); the kernel tiles the
  *packed* axis in tiles of 8, so where a row's keys are cut depends on the rows ranked before it.
* prefill_kernel_differs: prefills reduce the keys in tiles of 4 (a FlashAttention prefill kernel), decode
  steps in one pass (a paged decode kernel), as vLLM's V0 did with two libraries: a position's logits then
  depend on whether it was computed in a prefill or a step -- so a sequence re-prefilled after preemption, or
  joining a batch mid-way, does not continue with the bits it had.
"""

import torch

from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.kvcache.batch_invariant import BatchInvariantDecoder
from llm_inference_harness.numerics.fixed_order import attention, attention_partial
from llm_inference_harness.numerics.online_softmax import finalize, merge

TILE = 8  # slots per tile of the packed axis


def cut_attention(q, K, V, mask, cuts: list[int]):
    """Attention of q (1, H, T, d) over K, V (1, Hkv, S, d) as partials over the key ranges between ``cuts``,
    merged in order (exact in real arithmetic)."""
    B, H, T, d = q.shape
    edges = [0, *(c for c in cuts if 0 < c < K.shape[2]), K.shape[2]]
    visible = mask[:, None, None]  # (1, 1, 1, T, S)
    total = None
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        part = attention_partial(q, K[:, :, a:b], V[:, :, a:b], visible[..., a:b], d ** -0.5)
        total = part if total is None else merge(total, part)
    return finalize(total).reshape(B, H, T, d)  # (B, H, T, d)


class ReordersRowsByLength(BatchInvariantDecoder):
    def prefill(self, prompts):
        rank = sorted(range(len(prompts)), key=lambda b: -len(prompts[b]))  # longest first
        self.offsets, start = [0] * len(prompts), 0  # where each row starts in the packed pool (cu_seqlens)
        for b in rank:
            self.offsets[b], start = start, start + len(prompts[b])
        return super().prefill(prompts)

    def attend(self, layer, q, k, v):
        if layer == 0:
            self.plan()
        self.write(layer, k, v)
        K, V = self.cache[layer, :, :, :, : self.span]  # (B, Hkv, span, d) each
        rows = [cut_attention(q[b:b + 1], K[b:b + 1], V[b:b + 1], self.mask[b:b + 1],
                              list(range(-(self.offsets[b] % TILE), self.span, TILE)))
                for b in range(q.shape[0])]  # tile edges at packed multiples of TILE, in row b's own slots
        return torch.cat(rows)  # (B, H, T, d)


class PrefillKernelDiffers(BatchInvariantDecoder):
    def attend(self, layer, q, k, v):
        if layer == 0:
            self.plan()
        self.write(layer, k, v)
        K, V = self.cache[layer, :, :, :, : self.span]  # (B, Hkv, span, d) each
        if q.shape[2] == 1:  # a decode step: one pass
            return attention(q, K, V, self.mask[:, None, None], q.shape[-1] ** -0.5)
        return torch.cat([cut_attention(q[b:b + 1], K[b:b + 1], V[b:b + 1], self.mask[b:b + 1],
                                        list(range(4, self.span, 4))) for b in range(q.shape[0])])  # (B, H, T, d)


MUTANTS = {
    "reorders_rows_by_length": (ReordersRowsByLength, "rows_are_batch_invariant", "packs the rows by length, "
                                "longest first, and tiles the packed axis: a row's key tiles depend on the rows "
                                "ranked before it"),
    "prefill_kernel_differs": (PrefillKernelDiffers, "continuous_batching_is_invariant", "prefills reduce the keys "
                               "in tiles of 4, decode steps in one pass: a position's bits depend on whether a "
                               "prefill or a step computed it"),
}
for _name, (_cls, _killer, _bug) in MUTANTS.items():
    register("kvcache", f"mutant_{_name}", dtypes=("float64", "float32"), mutant=True, bug=_bug, killed_by=(_killer,),
             caps={"batch_invariant": True, "deterministic": True})(_cls)
