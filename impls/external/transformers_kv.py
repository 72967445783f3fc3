"""transformers models running with their own KV caches, through the kvcache model protocol.

One implementation per (architecture, cache class) pair, ``hf_<arch>_<cache>``: the tiny Llama (rotary, GQA),
Mistral (a sliding window of 4), GPT-2 (learned positions) and Gemma-2 (a sliding layer, then a global one) of
impls/external/hf_models.py, each with the cache classes transformers offers for it on CPU -- DynamicCache (evicting
past the window on a sliding layer), DynamicCache without a config (keeping everything), StaticCache (a rolling
buffer on a sliding layer) and, on the full-attention Llama, the fp8 QuantizedCache (approximate).  Invariant:
the harness's float64 full forward of each sequence alone is what every cached call returns, up to the rounding of
the model's dtype (or of fp8).  Weights are seeded and built offline
(llm_inference_harness.impls.external.hf_models.build).
"""

import functools

import torch

from llm_inference_harness.engine.registry import known_failure, library_unavailable, register
from llm_inference_harness.impls.external.hf_models import ARCHITECTURES, CACHES, TransformersLM, build

UNAVAILABLE = library_unavailable("transformers", install="pip install transformers, or the [external] extra")
# A process's first build imports transformers and the architecture's modeling code: seconds, and tens of seconds
# on a loaded 2-core machine, past the default 20 s per call.
CAPS = {"speaks": "model", "poisons": True, "call_limit_s": 120.0}
PAIRS = {
    "llama": ("dynamic", "static", "fp8"),
    "mistral": ("dynamic", "static", "dynamic_full"),
    "gpt2": ("dynamic", "static"),
    "gemma2": ("dynamic", "static"),
}


def adapter(arch: str, cache: str, lm_class: type = TransformersLM):
    """impl(dtype, seed) -> the model protocol over ``arch`` with ``cache``."""

    def make(dtype: torch.dtype, seed: int) -> TransformersLM:
        return lm_class(build(arch, seed, dtype), cache)

    make.__name__ = f"hf_{arch}_{cache}"
    return make


@functools.cache
def cite(arch: str, cache: str) -> str:
    return f"transformers {ARCHITECTURES[arch][0]} ({ARCHITECTURES[arch][3]}) with {CACHES[cache]}"


for _arch, _caches in PAIRS.items():
    for _cache in _caches:
        register("kvcache", f"hf_{_arch}_{_cache}", dtypes=("float32",), exact=_cache != "fp8",
                 caps={**CAPS, "kv_format": "float8_e4m3fn" if _cache == "fp8" else "model"},
                 unavailable=UNAVAILABLE, cite=cite(_arch, _cache))(adapter(_arch, _cache))

# transformers' fp8 cache calibrates one scale per layer on the first call (the prompt) and freezes it; the cast to
# float8_e4m3fn saturates, so any later key or value larger than every one of the prompt's is clipped to the
# prompt's largest -- after a one-token prompt, most of them.  Every property that decodes past the prompt sees it.
FP8_SATURATES = dict(
    library="transformers", version="5.24.0",
    what="QuantizedCache('fp8') (Fp8QuantizedLayer) freezes its per-tensor scale at the first update and the cast "
         "to float8_e4m3fn saturates: a later token's key or value above the first update's absmax is clipped to it "
         "(logits off by ~1 where fp8 rounding costs ~0.05)",
    reproduce="""import torch
from transformers.cache_utils import Fp8QuantizedLayer

layer = Fp8QuantizedLayer()
k = torch.tensor([[[[1.0, -0.5]]]])  # (B, Hkv, T, d): a one-token prompt's key
layer.update(k, k)  # the first call fixes the scale: max|k| / 448
keys, _ = layer.update(3 * k, 3 * k)  # the next token's key is 3x larger
print(keys[0, 0, 1])  # tensor([ 1., -1.]), not [3.0, -1.5]: saturated at the prompt's max""")
for _prop in ("prefill_then_steps_equal_forward", "left_padded_batch_equals_alone",
              "padded_and_unused_slots_never_leak", "caches_on_one_model_stay_apart",
              "rejected_calls_leave_the_cache_as_it_was", "long_sequences_past_the_sliding_window"):
    known_failure("kvcache", "hf_llama_fp8", f"model_{_prop}", **FP8_SATURATES)
