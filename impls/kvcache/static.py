"""Static cache (gpt-fast): k, v preallocated for max_len positions and written in place at each token's position.

Slot j of sequence b holds the token at position j; a query at position p reads slots 0..p (only the
slots up to the batch's furthest position are read at all, so a step costs O(length), not O(max_len)).
Unused slots are NaN from allocation on, so reading one would poison the output.  Invariant: slots
0..len_b - 1 hold exactly sequence b's keys/values.  PyTorch gpt-fast, model.py KVCache.update.
"""

import torch

from harness.contracts.kvcache import CachedDecoder, masked_attention
from harness.registry import register


class StaticDecoder(CachedDecoder):
    def allocate(self, batch):
        cfg = self.model.cfg
        shape = (cfg.n_layer, 2, batch, self.max_len, cfg.n_kv_head, cfg.head_dim)  # (L, k|v, B, S, Hkv, d)
        self.cache = torch.full(shape, float("nan"), dtype=self.dtype)
        self.rows = torch.arange(batch)[:, None]  # (B, 1)

    def write(self, layer, k, v):
        self.cache[layer, 0, self.rows, self.positions] = k.transpose(1, 2)  # (B, T, Hkv, d) at (b, pos)
        self.cache[layer, 1, self.rows, self.positions] = v.transpose(1, 2)

    def visible(self):
        slots = torch.arange(self.max_len)
        return slots[None, None, :] <= self.positions[:, :, None]  # (B, T, S)

    def read_span(self):
        """Slots worth reading: up to the furthest position in the batch (the mask handles shorter rows)."""
        return int(self.positions.max()) + 1

    def attend(self, layer, q, k, v):
        if layer == 0:  # the same positions in every layer
            self.span = self.read_span()
            self.mask = self.visible()[..., : self.span]  # (B, T, span)
        self.write(layer, k, v)
        K, V = self.cache[layer, :, :, : self.span].transpose(2, 3)  # (B, Hkv, span, d) each
        return masked_attention(q, K, V, self.mask)


register("kvcache", "static", dtypes=("float64", "float32"),
         cite="gpt-fast model.py KVCache (Meta PyTorch 2023)")(StaticDecoder)
