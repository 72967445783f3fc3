"""Static cache (gpt-fast): k, v preallocated for max_len positions and written in place at each token's position.

Slot j of sequence b holds the token at position j; a query at position p reads slots 0..p (only the
slots up to the batch's furthest position are read at all, so a step costs O(length), not O(max_len)).
When every row of the batch is at the same positions (batch-1 decode, equal-length prompts) the slots
a query sees are a prefix, so k, v are written by slicing and attention is one SDPA call with no mask
(causal for a prefill); ragged batches index per row and mask.  Unused slots are NaN from allocation
on, so reading one would poison the output.  Invariant: slots 0..len_b - 1 hold exactly sequence b's
keys/values.  PyTorch gpt-fast, model.py KVCache.update.
"""

import torch
import torch.nn.functional as F

from llm_inference_harness.contracts.kvcache import CachedDecoder, masked_attention
from llm_inference_harness.engine.registry import register


class StaticDecoder(CachedDecoder):
    def allocate(self, batch):
        cfg = self.model.cfg
        shape = (cfg.n_layer, 2, batch, cfg.n_kv_head, self.max_len, cfg.head_dim)  # (L, k|v, B, Hkv, S, d)
        self.cache = torch.full(shape, float("nan"), dtype=self.dtype)
        self.rows = torch.arange(batch)[:, None]  # (B, 1)

    def plan(self):
        """Once per call (every layer sees the same positions): the slots to read, and whether all rows are
        aligned -- the same positions start..start+T-1, all real, with T = 1 or start = 0."""
        self.span = self.read_span()
        start, T = int(self.positions[0, 0]), self.positions.shape[1]
        self.start = start if (T == 1 or start == 0) and bool((self.positions == self.positions[:1]).all()) \
            and bool(self.valid.all()) else None
        self.mask = None if self.start is not None else self.visible()[..., : self.span]  # (B, T, span)

    def write(self, layer, k, v):
        if self.start is not None:  # one slice for the whole batch
            self.cache[layer, :, :, :, self.start : self.start + k.shape[2]] = torch.stack([k, v])  # (2, B, Hkv, T, d)
        else:
            self.cache[layer, 0, self.rows, :, self.positions] = k.transpose(1, 2)  # (B, T, Hkv, d) at (b, pos)
            self.cache[layer, 1, self.rows, :, self.positions] = v.transpose(1, 2)

    def visible(self):
        slots = torch.arange(self.max_len)
        return slots[None, None, :] <= self.positions[:, :, None]  # (B, T, S)

    def read_span(self):
        """Slots worth reading: up to the furthest position in the batch (the mask handles shorter rows)."""
        return int(self.positions.max()) + 1

    def attend(self, layer, q, k, v):
        if layer == 0:
            self.plan()
        self.write(layer, k, v)
        K, V = self.cache[layer, :, :, :, : self.span]  # (B, Hkv, span, d) each
        if self.start is None:
            return masked_attention(q, K, V, self.mask)
        # aligned: a decode query sees every slot read; a prefill from 0 is plain causal attention
        return F.scaled_dot_product_attention(q, K, V, is_causal=q.shape[2] > 1, enable_gqa=q.shape[1] != K.shape[1])


register("kvcache", "static", dtypes=("float64", "float32"),
         cite="gpt-fast model.py KVCache (Meta PyTorch 2023)")(StaticDecoder)
