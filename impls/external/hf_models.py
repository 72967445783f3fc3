"""Tiny transformers causal LMs built offline from configs in code, and the kvcache model protocol over them.

`build(arch, seed, dtype)` makes one of `ARCHITECTURES` with weights drawn from the seed (float64 draws rounded to
dtype; nothing is downloaded); `TransformersLM(module, cache)` speaks the model protocol of
harness/contracts/kvcache.py for any transformers causal LM and one of `CACHES`, the cache classes transformers
offers on CPU.  The harness plays `generate`: it left-pads and numbers the tokens, and the adapter passes
``attention_mask``, ``position_ids`` and ``cache`` straight to the model, which sizes its masks from the cache
(transformers 5 has no ``cache_position``: each cache layer counts its own tokens).  Invariant: a cache's slot s
of row b holds the token the harness's mask has at column s (or, for a sliding layer, at the column its
window ends on).  transformers is imported at the first call, never at import: without it, the adapters in
impls/external/transformers_kv.py register as unavailable and every property skips.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from llm_inference_harness.contracts.kvcache import check_model_call, check_new_cache
from llm_inference_harness.strategies.common import generator

VOCAB = 32
POSITIONS = 48  # every architecture's context: long enough to pass each sliding window several times
_SMALL = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=POSITIONS, bos_token_id=0, eos_token_id=0,
              pad_token_id=None)
# name -> (model class, config class, config kwargs, what is particular about its cache)
ARCHITECTURES: dict[str, tuple[str, str, dict, str]] = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {**_SMALL, "attn_implementation": "sdpa"},
              "rotary positions, grouped-query attention (4 query heads on 2 kv heads), full attention"),
    "mistral": ("MistralForCausalLM", "MistralConfig", {**_SMALL, "sliding_window": 4, "attn_implementation": "sdpa"},
                "rotary, GQA, a sliding window of 4 in every layer (its caches evict)"),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=4,
                                                   n_positions=POSITIONS, bos_token_id=0, eos_token_id=0,
                                                   attn_implementation="sdpa"),
             "learned positions, multi-head attention, LayerNorm, fused Conv1D qkv"),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", {**_SMALL, "head_dim": 4, "sliding_window": 5,
                                                     "query_pre_attn_scalar": 4, "attn_implementation": "eager"},
               "a sliding layer (window 5) then a global one, attention and final logit soft-capping"),
}
# name -> what transformers class it is and how it holds keys and values
CACHES = {
    "dynamic": "DynamicCache(config=...): grows by concatenation; a sliding layer keeps its last W - 1 tokens",
    "dynamic_full": "DynamicCache(): no config, every layer keeps every token (the mask alone slides the window)",
    "static": "StaticCache(config=..., max_cache_len=max_len): preallocated, written in place; a sliding layer is "
              "a rolling buffer of W slots",
    "fp8": "QuantizedCache('fp8', config=...): float8_e4m3fn with one scale per layer, frozen at the first call",
}


def build(arch: str, seed: int, dtype: torch.dtype = torch.float32):
    """``arch`` with weights drawn from ``seed`` in float64 and rounded to ``dtype``; eval mode, on the CPU.

    Matrices are N(0, 1 / fan-in) (embeddings N(0, 1)), so activations stay O(1); norms 1 + N(0, 0.01), biases
    N(0, 0.01): every weight is non-trivial, where a default init's zero biases and unit norms would hide a bug."""
    import transformers

    model_cls, config_cls, kwargs, _ = ARCHITECTURES[arch]
    kwargs = dict(kwargs)
    attn = kwargs.pop("attn_implementation")
    config = getattr(transformers, config_cls)(**kwargs)
    config._attn_implementation = attn
    with torch.random.fork_rng(devices=[]):  # the default init draws from the global RNG: leave it as it was
        module = getattr(transformers, model_cls)(config).double().eval()
    g = generator(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if p.dim() == 2:
                embedding = any(part in name for part in ("embed", "wte", "wpe"))
                p.copy_(noise if embedding else noise / min(p.shape) ** 0.5)  # Conv1D is (in, out), Linear (out, in)
            else:
                p.copy_((1 if "norm" in name or ".ln" in name else 0) + 0.1 * noise)
    return module.to(dtype)


@dataclass
class HFCache:
    """A transformers cache and what the adapter knows of it: rows, room, and slots filled so far."""

    inner: Any
    batch: int
    max_len: int
    seen: int = 0


class TransformersLM:
    """The model protocol over a transformers causal LM ``module`` and the cache class named ``cache``."""

    def __init__(self, module, cache: str) -> None:
        if cache not in CACHES:
            raise ValueError(f"TransformersLM: cache must be one of {', '.join(CACHES)}, got {cache!r}")
        self.module, self.cache = module.eval(), cache
        config = module.config
        self.vocab_size, self.max_positions = config.vocab_size, config.max_position_embeddings
        self.dtype = next(module.parameters()).dtype
        layer_types = getattr(config, "layer_types", None) or ()
        windowed = getattr(config, "sliding_window", None) is not None and (
            not layer_types or "sliding_attention" in layer_types)
        self.sliding_window = config.sliding_window if windowed else None

    def new_cache(self, batch: int, max_len: int) -> HFCache:
        import transformers

        check_new_cache(batch, max_len, self.max_positions)
        config = self.module.config
        inner = {"dynamic": lambda: transformers.DynamicCache(config=config),
                 "dynamic_full": lambda: transformers.DynamicCache(),
                 "static": lambda: transformers.StaticCache(config=config, max_cache_len=max_len),
                 "fp8": lambda: transformers.QuantizedCache("fp8", config)}[self.cache]()
        return HFCache(inner, batch, max_len)

    def __call__(self, tokens, mask, positions, cache):
        if cache is not None and not isinstance(cache, HFCache):
            raise TypeError(f"cache must be None or what new_cache returned, got {type(cache).__name__}")
        check_model_call(tokens, mask, positions, vocab_size=self.vocab_size, max_positions=self.max_positions,
                         seen=cache.seen if cache else 0, batch=cache.batch if cache else None,
                         max_len=cache.max_len if cache else None)
        return self.forward(tokens, mask, positions, cache)

    def forward(self, tokens, mask, positions, cache):
        """The model call, once the inputs are known to be valid."""
        with torch.no_grad():
            if cache is None:
                out = self.module(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=False)
                return out.logits, None
            out = self.module(input_ids=tokens, attention_mask=mask, position_ids=positions, cache=cache.inner,
                              use_cache=True)
        cache.seen += tokens.shape[1]
        return out.logits, cache

    def in_float64(self, roundtrip: Callable[[torch.Tensor], torch.Tensor] | None = None) -> TransformersLM:
        module = copy.deepcopy(self.module).double()
        if roundtrip is not None:
            module.config._attn_implementation = _roundtrip_attention(module.config._attn_implementation, roundtrip)
        return TransformersLM(module, self.cache)  # the model itself, whatever a subclass changes

    def poison(self, cache: HFCache, real: torch.Tensor, value: float) -> None:
        """Keys 0 and values ``value`` in every stored slot whose token the mask ``real`` (B, S) calls a pad, and in
        every slot not yet written."""
        with torch.no_grad():
            for layer in cache.inner.layers:
                keys, values = _stores(layer)
                fill = (torch.zeros((), dtype=keys.dtype), _code(value, values.dtype, layer))
                for slot, absolute in enumerate(_stored_slots(layer, real.shape[1])):
                    rows = torch.ones(real.shape[0], dtype=torch.bool) if absolute < 0 else ~real[:, absolute]
                    for store, code in zip((keys, values), fill, strict=True):
                        if store.dtype == torch.float8_e4m3fn:  # fp8 has no masked_fill: write its bytes
                            store.view(torch.uint8)[rows, :, slot] = code.view(torch.uint8)
                        else:
                            store[rows, :, slot] = code


def _stores(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensors a cache layer keeps keys and values in, (B, Hkv, slots, d) each."""
    if hasattr(layer, "_quantized_keys"):
        return layer._quantized_keys[0], layer._quantized_values[0]
    return layer.keys, layer.values


def _code(value: float, dtype: torch.dtype, layer) -> torch.Tensor:
    """``value`` as a store of ``dtype`` holds it: an fp8 code of value / the layer's value scale (saturating)."""
    if dtype != torch.float8_e4m3fn:
        return torch.tensor(value, dtype=dtype)
    return (torch.tensor(value, dtype=torch.float32) / layer._quantized_values[1]).to(dtype)


def _stored_slots(layer, S: int) -> list[int]:
    """For each slot a cache layer stores, the mask column (absolute slot) it holds, or -1 if never written."""
    from transformers.cache_utils import DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer

    if not layer.is_initialized:
        return []
    n = _stores(layer)[0].shape[2]
    if isinstance(layer, StaticSlidingWindowLayer):  # a rolling buffer once more than W tokens came
        written = layer.cumulative_length_int
        return list(range(written - n, written)) if written > n else [j if j < written else -1 for j in range(n)]
    if isinstance(layer, StaticLayer):
        return [j if j < S else -1 for j in range(n)]
    if isinstance(layer, DynamicSlidingWindowLayer):
        return list(range(S - n, S))  # the last n tokens
    return list(range(n))


_ROUNDTRIPS: dict[tuple[str, Callable], str] = {}


def _roundtrip_attention(base: str, roundtrip: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """Register (once) an attention implementation that is ``base`` reading ``roundtrip(k)``, ``roundtrip(v)``; its
    name.  It sees keys and values as the cache returns them, rotary positions applied (what a cache stores)."""
    key = (base, roundtrip)
    if key not in _ROUNDTRIPS:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        if base not in ALL_ATTENTION_FUNCTIONS:
            raise ValueError(f"roundtrip: needs a registered attention implementation (sdpa, ...), not {base!r}")
        attend = ALL_ATTENTION_FUNCTIONS[base]
        name = f"harness_roundtrip_{len(_ROUNDTRIPS)}"

        def attention(module, query, key_states, value_states, *args, **kwargs):
            return attend(module, query, roundtrip(key_states), roundtrip(value_states), *args, **kwargs)

        AttentionInterface.register(name, attention)
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
        _ROUNDTRIPS[key] = name
    return _ROUNDTRIPS[key]
