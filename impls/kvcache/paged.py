"""Paged cache: k, v live in fixed-size blocks of a shared pool, found through a per-sequence block table.

Position p of sequence b is slot ``table[b, p // P] * P + p % P`` of the pool; blocks are handed
out on demand from a free list (in reverse order, so no sequence's blocks are contiguous), and a
query at position p gathers its sequence's blocks and reads the written logical slots 0..p.  The pool starts
NaN-filled.  Invariant: the table maps every written position to a block owned by that sequence
alone.  Kwon et al. 2023, "Efficient Memory Management ... with PagedAttention", section 4.1-4.2.
"""

import torch

from llm_inference_harness.contracts.kvcache import CachedDecoder, masked_attention
from llm_inference_harness.engine.registry import register

BLOCK = 4  # tokens per block: small, so short test sequences already span several blocks


class PagedDecoder(CachedDecoder):
    def allocate(self, batch):
        cfg = self.model.cfg
        per_seq = -(-self.max_len // BLOCK)  # blocks one sequence may need
        self.pool = torch.full((cfg.n_layer, 2, batch * per_seq * BLOCK, cfg.n_kv_head, cfg.head_dim),
                               float("nan"), dtype=self.dtype)  # (L, k|v, slots, Hkv, d)
        self.free = list(range(batch * per_seq))  # popped from the end: the last block goes first
        self.table = torch.full((batch, per_seq), -1, dtype=torch.long)  # (B, blocks), -1: none yet
        self.written = torch.zeros(batch, per_seq * BLOCK, dtype=torch.bool)  # (B, S) logical slots

    def slots(self):
        """Pool slots of the real tokens at self.positions, allocating blocks they need; (rows, slots)."""
        rows, pos = self.valid.nonzero(as_tuple=True)[0], self.positions[self.valid]  # (n,), (n,)
        for b, blk in {(int(b), int(p) // BLOCK) for b, p in zip(rows, pos, strict=True)}:
            if self.table[b, blk] < 0:
                self.table[b, blk] = self.free.pop()
        return self.table[rows, pos // BLOCK] * BLOCK + pos % BLOCK

    def attend(self, layer, q, k, v):
        if layer == 0:
            self.write_slots = self.slots()
            self.written[self.valid.nonzero(as_tuple=True)[0], self.positions[self.valid]] = True
        self.pool[layer, 0, self.write_slots] = k.transpose(1, 2)[self.valid]  # (n, Hkv, d)
        self.pool[layer, 1, self.write_slots] = v.transpose(1, 2)[self.valid]
        B, blocks = self.table.shape
        logical = self.table.clamp(min=0)[:, :, None] * BLOCK + torch.arange(BLOCK)  # (B, blocks, P)
        K, V = self.pool[layer][:, logical.reshape(B, -1)].transpose(2, 3)  # (B, Hkv, blocks * P, d) each
        slot_pos = torch.arange(blocks * BLOCK)
        visible = self.written[:, None, :] & (slot_pos[None, None, :] <= self.positions[:, :, None])  # (B, T, S)
        return masked_attention(q, K, V, visible)


register("kvcache", "paged", dtypes=("float64", "float32"),
         cite="Kwon et al. 2023, PagedAttention, sections 4.1-4.2")(PagedDecoder)
