"""Concatenating cache: each call appends the new keys/values along the sequence axis (HF DynamicCache).

Every slot carries its position and whether it holds a real token (ragged prompts are right-padded),
so a query at position p sees exactly the real slots at positions <= p.  Invariant: after t tokens
the cache holds their k, v in arrival order.  Pope et al. 2022, "Efficiently Scaling Transformer
Inference", section 2.
"""

import torch

from llm_inference_harness.contracts.kvcache import CachedDecoder, masked_attention
from llm_inference_harness.engine.registry import register


class ConcatDecoder(CachedDecoder):
    def allocate(self, batch):
        self.cache = {}  # layer -> (k, v (B, Hkv, S, d), slot positions (B, S), slot is real (B, S))

    def append(self, layer, k, v):
        if layer not in self.cache:
            self.cache[layer] = (k, v, self.positions, self.valid)
        else:
            K, V, pos, real = self.cache[layer]
            self.cache[layer] = (torch.cat([K, k], dim=2), torch.cat([V, v], dim=2),  # (B, Hkv, S+T, d)
                                 torch.cat([pos, self.positions], dim=1), torch.cat([real, self.valid], dim=1))
        return self.cache[layer]

    def attend(self, layer, q, k, v):
        K, V, pos, real = self.append(layer, k, v)
        visible = real[:, None, :] & (pos[:, None, :] <= self.positions[:, :, None])  # (B, T, S)
        return masked_attention(q, K, V, visible)


register("kvcache", "concat", dtypes=("float64", "float32"),
         cite="Pope et al. 2022, section 2")(ConcatDecoder)
