"""Known-wrong transformers caches: the model-protocol adapter
(llm_inference_harness.impls.external.hf_models.TransformersLM) with one real cache bug each, modelled on bugs reported
against transformers, vLLM and llama.cpp.  Each alters cached calls only (the full forward, the oracle's plain
computation, stays right), and the properties of properties/test_kvcache_models.py must kill every one for the reason
named in ``killed_by``.
"""

import copy
import functools

import torch

from llm_inference_harness.contracts.kvcache import check_model_call
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.external.hf_models import TransformersLM
from llm_inference_harness.impls.external.transformers_kv import CAPS, UNAVAILABLE, adapter


class PositionsRestart(TransformersLM):
    """Every cached call numbers its tokens from 0, as a generation loop passing each chunk's own arange does:
    positions restart during cached decoding (RoPE sees every step at position 0)."""

    def forward(self, tokens, mask, positions, cache):
        if cache is not None:
            positions = torch.arange(tokens.shape[1]).expand_as(tokens)  # (B, T)
        return super().forward(tokens, mask, positions, cache)


class PositionsCountPads(TransformersLM):
    """No position_ids reach the model, so it numbers tokens by cache slot (the cache's length + arange(T)): a
    left-padded row's positions count its pads, and batched generation with left padding diverges from the same
    prompt alone (transformers' GPT-2 / Llama batched-generation reports)."""

    def forward(self, tokens, mask, positions, cache):
        if cache is not None:
            positions = (mask.shape[1] - tokens.shape[1] + torch.arange(tokens.shape[1])).expand_as(tokens)  # (B, T)
        return super().forward(tokens, mask, positions, cache)


class StepMaskDropsPadding(TransformersLM):
    """Only the prefill is given the attention mask; decode steps pass none, so a left-padded row's new tokens
    attend to its pads (a generation loop that does not extend attention_mask past the prompt)."""

    def forward(self, tokens, mask, positions, cache):
        if cache is not None and cache.seen:
            mask = None
        return super().forward(tokens, mask, positions, cache)


class SlidingWindowEvictsEarly(TransformersLM):
    """The sliding-window cache keeps W - 2 past tokens where W - 1 are needed, so a new query sees W - 1 keys: the
    off-by-one between "a window of W keys" and "W past tokens" that transformers' sliding-window caches and
    Mistral's flash-attention window disagreed on."""

    def new_cache(self, batch, max_len):
        import transformers

        cache = super().new_cache(batch, max_len)
        narrower = copy.deepcopy(self.module.config)
        narrower.sliding_window = self.sliding_window - 1
        cache.inner = transformers.DynamicCache(config=narrower)
        return cache


class WritesOneSlotLate(TransformersLM):
    """After the prefill the static cache's write index runs one ahead (cache_position = past length + 1): every
    decoded token is written one slot late, so the mask shows an unwritten slot and hides the token itself
    ("decoding writes at L + 1").  The cache has one slot more than asked for, so the last write still fits."""

    def new_cache(self, batch, max_len):
        import transformers

        cache = super().new_cache(batch, max_len)
        cache.inner = transformers.StaticCache(config=self.module.config, max_cache_len=max_len + 1)
        return cache

    def forward(self, tokens, mask, positions, cache):
        first = cache is not None and not cache.seen
        out = super().forward(tokens, mask, positions, cache)
        if first:
            for layer in cache.inner.layers:
                layer.cumulative_length.add_(1)
        return out


class BatchSortedByLength(TransformersLM):
    """The prefill sorts rows by prompt length (a serving engine bucketing requests) and puts the logits back in
    order, but later calls feed the cache in the caller's order: each row's new token lands in another
    sequence's cache (vLLM's persistent-batch reordering bugs)."""

    def forward(self, tokens, mask, positions, cache):
        if cache is None or cache.seen:
            return super().forward(tokens, mask, positions, cache)
        order = mask.sum(dim=1).argsort(stable=True)  # (B,): shortest prompt first
        logits, cache = super().forward(tokens[order], mask[order], positions[order], cache)
        return logits[order.argsort()], cache  # (B, T, V) back in the caller's order


class CapacityCheckedAfterAppend(TransformersLM):
    """The room check runs after the model call: a call past max_len raises, but its keys and values were already
    appended, and the next call reads them as its own past (a request rejected as too long after its cache
    blocks were written and never freed)."""

    def __call__(self, tokens, mask, positions, cache):
        check_model_call(tokens, mask, positions, vocab_size=self.vocab_size, max_positions=self.max_positions,
                         seen=cache.seen if cache else 0, batch=cache.batch if cache else None)
        seen = cache.seen if cache else 0
        out = self.forward(tokens, mask, positions, cache)
        if cache is not None and mask.shape[1] > cache.max_len:
            cache.seen = seen
            raise ValueError(f"this call needs {mask.shape[1]} slots; the cache has max_len={cache.max_len}")
        return out


class CachesShareOneBuffer(TransformersLM):
    """Every static cache of one batch size is handed the same preallocated key and value buffers, kept on the model:
    a second request writes into the slots a live one reads (transformers' generate reusing the model's one static
    cache across calls; a serving engine's slot allocator handing out a busy slot).  Each cache keeps its own write
    index, so one request alone decodes right."""

    def new_cache(self, batch, max_len):
        import transformers

        cache = super().new_cache(batch, max_len)
        cache.inner = transformers.StaticCache(config=self.module.config, max_cache_len=self.max_positions)
        buffers = self.__dict__.setdefault("buffers", {})  # (batch, layer) -> (keys, values)
        for i, layer in enumerate(cache.inner.layers):
            layer.lazy_initialization = functools.partial(_share, layer, buffers, (batch, i))
        return cache


def _share(layer, buffers: dict, key: tuple[int, int], keys: torch.Tensor, values: torch.Tensor) -> None:
    type(layer).lazy_initialization(layer, keys, values)
    layer.keys, layer.values = buffers.setdefault(key, (layer.keys, layer.values))  # (B, Hkv, max_positions, d)


MUTANTS = {
    "positions_restart": ("llama", "dynamic", PositionsRestart, "cached calls number their tokens from 0 again",
                          "model_prefill_then_steps_equal_forward"),
    "positions_count_pads": ("gpt2", "dynamic", PositionsCountPads, "positions by cache slot: a left-padded row's "
                             "positions count its pads", "model_left_padded_batch_equals_alone"),
    "step_mask_drops_padding": ("llama", "dynamic", StepMaskDropsPadding, "decode steps get no attention mask and "
                                "attend to the left pads", "model_left_padded_batch_equals_alone"),
    "sliding_window_evicts_early": ("mistral", "dynamic", SlidingWindowEvictsEarly, "the sliding-window cache keeps "
                                    "W - 2 past tokens: a query sees W - 1 keys",
                                    "model_long_sequences_past_the_sliding_window"),
    "writes_one_slot_late": ("llama", "static", WritesOneSlotLate, "the static cache writes each decoded token at "
                             "L + 1, leaving an unwritten slot in view", "model_prefill_then_steps_equal_forward"),
    "batch_sorted_by_length": ("llama", "dynamic", BatchSortedByLength, "the prefill reorders rows by length; later "
                               "calls feed them in the caller's order", "model_left_padded_batch_equals_alone"),
    "capacity_checked_after_append": ("gpt2", "dynamic", CapacityCheckedAfterAppend, "a call past max_len raises "
                                      "after its keys and values were appended",
                                      "model_rejected_calls_leave_the_cache_as_it_was"),
    "caches_share_one_buffer": ("llama", "static", CachesShareOneBuffer, "every cache of one batch size writes into "
                                "the same key and value buffers", "model_caches_on_one_model_stay_apart"),
}
for _name, (_arch, _cache, _cls, _bug, _killer) in MUTANTS.items():
    register("kvcache", f"mutant_hf_{_name}", dtypes=("float32",), mutant=True, bug=_bug, killed_by=(_killer,),
             caps=CAPS, unavailable=UNAVAILABLE)(adapter(_arch, _cache, _cls))
