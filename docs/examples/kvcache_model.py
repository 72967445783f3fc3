"""A model with its own KV cache, in the kvcache model protocol (harness/contracts/kvcache.py):

    harness check kvcache --plugin docs/examples/kvcache_model.py:build

The harness's tiny GPT with a cache of its own: per layer, keys and values concatenated along the slots; a
query at slot i of the S slots sees slot j iff j <= i and the mask calls j a real token.
"""

import copy

import torch

from llm_inference_harness import declare
from llm_inference_harness.contracts.kvcache import check_model_call, check_new_cache, masked_attention
from llm_inference_harness.models.gpt import GPT, GPTConfig


class TinyLM:
    def __init__(self, model):
        self.model, self.vocab_size, self.max_positions = model, model.cfg.vocab_size, model.cfg.block_size
        self.dtype, self.sliding_window = next(model.parameters()).dtype, None

    def new_cache(self, batch, max_len):
        check_new_cache(batch, max_len, self.max_positions)
        return {"batch": batch, "max_len": max_len, "seen": 0, "kv": {}}

    def __call__(self, tokens, mask, positions, cache):
        seen, S = cache["seen"] if cache else 0, mask.shape[1]
        check_model_call(tokens, mask, positions, vocab_size=self.vocab_size, max_positions=self.max_positions,
                         seen=seen, batch=cache and cache["batch"], max_len=cache and cache["max_len"])
        kv = cache["kv"] if cache else {}
        visible = mask.bool()[:, None, :] & (torch.arange(S) <= torch.arange(seen, S)[:, None])  # (B, T, S)

        def attend(layer, q, k, v):  # q (B, H, T, d); k, v (B, Hkv, T, d): the new tokens' own
            if layer in kv:
                k, v = torch.cat([kv[layer][0], k], dim=2), torch.cat([kv[layer][1], v], dim=2)  # (B, Hkv, S, d)
            kv[layer] = k, v
            return masked_attention(q, k, v, visible)  # a pad's own row sees nothing: NaN there, never read

        with torch.no_grad():
            logits = self.model.forward_with(tokens, positions, attend)  # (B, T, V)
        if cache:
            cache["seen"] = S
        return logits, cache

    def in_float64(self, roundtrip=None):
        return TinyLM(copy.deepcopy(self.model).double())


@declare(dtypes=("float32",), caps={"speaks": "model"})
def build(dtype, seed):
    with torch.random.fork_rng():  # the default init draws from torch's RNG: leave the caller's as it was
        torch.manual_seed(seed)
        model = GPT(GPTConfig(vocab_size=16, block_size=32, n_layer=2, n_head=2, n_kv_head=1, n_embd=16))
    return TinyLM(model.to(dtype).eval())
