"""Batch-invariant decoding: the static cache, with the model's layers and the cache attention computed in a
fixed reduction order (harness/numerics/fixed_order.py), so a sequence's logits hold the same bits whatever it is
decoded with -- and however its tokens reached the cache.

Every linear layer adds its in-features in one order whatever the number of tokens M in the call (a BLAS
GEMM picks its kernel by M: a decode step of one sequence takes the GEMV path), LayerNorm and GELU work row
by row, and a query reads its own sequence's slots 0..p with the slots it cannot see adding exact zeros.
So token p's logits are the same bits alone or in any batch, in any order, and whether p was computed in a
prefill (with the tokens before it) or in a step: a sequence preempted and re-prefilled with everything it
has, or joining a running batch, goes on exactly as before.  Invariant: row b's logits equal, bit for bit,
those of sequence b decoded alone.  He et al. 2025, "Defeating Nondeterminism in LLM Inference" (batch
invariance of every kernel; KV-cache and prefill consistency); PyTorch gpt-fast, model.py KVCache.
"""

from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.kvcache.static import StaticDecoder
from llm_inference_harness.numerics.fixed_order import BatchInvariantMode, attention


class BatchInvariantDecoder(StaticDecoder):
    def plan(self):
        self.span, self.start = self.read_span(), None  # always the indexed write and the mask: no SDPA path
        self.mask = self.visible()[..., : self.span]  # (B, T, span): slots 0..p, a prefix of each row

    def attend(self, layer, q, k, v):
        if layer == 0:
            self.plan()
        self.write(layer, k, v)
        K, V = self.cache[layer, :, :, :, : self.span]  # (B, Hkv, span, d) each
        return attention(q, K, V, self.mask[:, None, None], q.shape[-1] ** -0.5)  # (B, H, T, d)

    def prefill(self, prompts):
        with BatchInvariantMode():
            return super().prefill(prompts)

    def step(self, tokens):
        with BatchInvariantMode():
            return super().step(tokens)


register("kvcache", "batch_invariant", dtypes=("float64", "float32"), caps={"batch_invariant": True,
                                                                            "deterministic": True},
         cite="He et al. 2025, Defeating Nondeterminism in LLM Inference; gpt-fast KVCache")(BatchInvariantDecoder)
