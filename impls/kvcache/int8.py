"""Int8 cache: the static layout, with every stored key/value vector quantized to int8 with its own scale.

Each (sequence, position, kv head) vector x is stored as round(x / s) in [-127, 127] with
s = max|x| / 127 (symmetric absmax), and read back as q * s; the error per element is at most s / 2.
Halves fp16 cache memory (a quarter of float32) at the cost of approximate logits, so it is declared
``exact=False`` and held to the "kv_int8" tolerance row.  Unused slots have NaN scales from allocation
on.  Hooper et al. 2024, "KVQuant", section 3 (per-token quantization); Dettmers et al. 2022, "LLM.int8()",
section 3.1 (absmax).
"""

import torch

from llm_inference_harness.contracts.kvcache import masked_attention
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.kvcache.static import StaticDecoder


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., d) -> int8 codes (..., d) and scales (..., 1) with x ~= codes * scales."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny) / 127  # (..., 1)
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


class Int8Decoder(StaticDecoder):
    def allocate(self, batch):
        cfg = self.model.cfg
        shape = (cfg.n_layer, 2, batch, self.max_len, cfg.n_kv_head)  # (L, k|v, B, S, Hkv)
        self.codes = torch.zeros((*shape, cfg.head_dim), dtype=torch.int8)  # (L, k|v, B, S, Hkv, d)
        self.scales = torch.full((*shape, 1), float("nan"), dtype=self.dtype)  # (L, k|v, B, S, Hkv, 1)
        self.rows = torch.arange(batch)[:, None]  # (B, 1)

    def write(self, layer, k, v):
        for i, x in enumerate((k, v)):
            codes, scale = quantize(x.transpose(1, 2))  # (B, T, Hkv, d), (B, T, Hkv, 1)
            self.codes[layer, i, self.rows, self.positions] = codes
            self.scales[layer, i, self.rows, self.positions] = scale

    def attend(self, layer, q, k, v):
        if layer == 0:
            self.span = self.read_span()
            self.mask = self.visible()[..., : self.span]  # (B, T, span)
        self.write(layer, k, v)
        n = self.span
        codes, scales = self.codes[layer, :, :, :n], self.scales[layer, :, :, :n]  # (k|v, B, n, Hkv, ...)
        K, V = (codes.to(self.dtype) * scales).transpose(2, 3)  # (B, Hkv, n, d) each
        return masked_attention(q, K, V, self.mask)


register("kvcache", "int8", dtypes=("float64", "float32"),
         exact=False, cite="Hooper et al. 2024 (KVQuant), section 3")(Int8Decoder)
