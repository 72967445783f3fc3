"""Known-wrong KV caches, each modelled on a real bug and otherwise identical to a correct layout.

The properties must kill every one, for the reason named in ``killed_by``.
"""

import torch

from llm_inference_harness.contracts.kvcache import masked_attention
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.kvcache.concat import ConcatDecoder
from llm_inference_harness.impls.kvcache.static import StaticDecoder


class PositionsRestart(StaticDecoder):
    """Decode positions counted from the end of the prompt (a per-call arange), not from the sequence start."""

    def next_positions(self):
        return self.lengths[:, None] - self.prompt_lengths[:, None]  # (B, 1)

    def prefill(self, prompts):
        self.prompt_lengths = torch.tensor([len(p) for p in prompts])
        return super().prefill(prompts)


class WritesOneSlotLate(StaticDecoder):
    """The decoded token is written at position + 1 (an off-by-one in the write index), leaving a hole."""

    def write(self, layer, k, v):
        shift = int(self.positions.shape[1] == 1)  # decode steps only
        late = (self.positions + shift).clamp(max=self.max_len - 1)  # (B, T)
        self.cache[layer, 0, self.rows, :, late] = k.transpose(1, 2)  # (B, T, Hkv, d) at (b, late)
        self.cache[layer, 1, self.rows, :, late] = v.transpose(1, 2)


class AppendsTwice(ConcatDecoder):
    """Each decode step's keys/values are appended twice (an update called from two code paths)."""

    def append(self, layer, k, v):
        if layer in self.cache and self.positions.shape[1] == 1:
            super().append(layer, k, v)
        return super().append(layer, k, v)


def modulo_gqa_attention(q, k, v, visible):
    """masked_attention with query head h reading kv head h % Hkv instead of h // (H // Hkv)."""
    B, H, T, d = q.shape
    Hkv = k.shape[1]
    grouped = q.reshape(B, H // Hkv, Hkv, T, d).transpose(1, 2)  # (B, Hkv, G, T, d): head g * Hkv + j -> j
    out = masked_attention(grouped.reshape(B, H, T, d), k, v, visible)  # (B, H, T, d) in (j, g) order
    return out.reshape(B, Hkv, H // Hkv, T, d).transpose(1, 2).reshape(B, H, T, d)  # back to head order


class ModuloGQA(StaticDecoder):
    def attend(self, layer, q, k, v):
        if layer == 0:
            self.plan()
        self.write(layer, k, v)
        K, V = self.cache[layer]  # (B, Hkv, S, d) each
        return modulo_gqa_attention(q, K, V, self.visible())


class MaskIgnoresCacheLength(StaticDecoder):
    """Every sequence of the batch attends up to the longest sequence's position (a batch-wide length)."""

    def visible(self):
        longest = self.positions.max(dim=0, keepdim=True).values  # (1, T)
        slots = torch.arange(self.max_len)
        return (slots[None, None, :] <= longest[:, :, None]).expand(self.positions.shape[0], -1, -1)  # (B, T, S)


class ReadsUnwrittenSlots(StaticDecoder):
    """Decode steps attend over the whole preallocated cache, unused slots included."""

    def read_span(self):
        return self.max_len

    def visible(self):
        if self.positions.shape[1] > 1:
            return super().visible()
        return torch.ones(self.positions.shape[0], 1, self.max_len, dtype=torch.bool)  # (B, 1, S)


class SizedForThePrompt(StaticDecoder):
    """Room for the prompt plus 8 tokens (a serving engine's first guess); once full, each new token overwrites
    the last slot instead of failing or growing the cache."""

    ROOM = 8

    def allocate(self, batch):
        super().allocate(batch)
        self.slots = None  # fixed by the prefill

    def plan(self):
        if self.slots is None:
            self.slots = min(self.max_len, self.positions.shape[1] + self.ROOM)
        super().plan()
        self.start, self.mask = None, self.visible()[..., : self.span]  # always the indexed path

    def write(self, layer, k, v):
        slot = self.positions.clamp(max=self.slots - 1)  # (B, T)
        self.cache[layer, 0, self.rows, :, slot] = k.transpose(1, 2)  # (B, T, Hkv, d) at (b, slot)
        self.cache[layer, 1, self.rows, :, slot] = v.transpose(1, 2)

    def visible(self):
        slots = torch.arange(self.max_len)
        return (slots[None, None, :] <= self.positions[:, :, None]) & (slots < self.slots)  # (B, T, S)


class KeepsCacheAcrossPrefill(ConcatDecoder):
    """A second prefill with the same batch size appends to the old batch's cache (past_key_values reused
    across generate calls), so the new prompts attend to the old sequences' keys."""

    def allocate(self, batch):
        if getattr(self, "batch", None) != batch:
            super().allocate(batch)
            self.batch = batch


class SlidingWindow(StaticDecoder):
    """A leftover sliding-window mask (Mistral's 4096, here 24 tokens): a query sees only the last 24 keys."""

    WINDOW = 24

    def plan(self):
        super().plan()
        self.start, self.mask = None, self.visible()[..., : self.span]  # always the masked path

    def visible(self):
        slots = torch.arange(self.max_len)[None, None, :]
        return (slots <= self.positions[:, :, None]) & (slots > self.positions[:, :, None] - self.WINDOW)


class CacheOnModel(StaticDecoder):
    """The cache lives on the model object (gpt-fast's model.setup_caches, grown to the largest batch and
    length asked for), so every decoder of that model reads and writes the same one."""

    def allocate(self, batch):
        cfg, shared = self.model.cfg, getattr(self.model, "kv_cache", None)
        if shared is None or shared.shape[2] < batch or shared.shape[4] < self.max_len:
            rows, slots = max(batch, 0 if shared is None else shared.shape[2]), max(self.max_len, 0 if shared is None
                                                                                     else shared.shape[4])
            shape = (cfg.n_layer, 2, rows, cfg.n_kv_head, slots, cfg.head_dim)  # (L, k|v, B, Hkv, S, d)
            self.model.kv_cache = torch.full(shape, float("nan"), dtype=self.dtype)  # outside the state_dict
        self.rows = torch.arange(batch)[:, None]  # (B, 1)

    @property
    def cache(self):
        return self.model.kv_cache[:, :, : self.rows.shape[0], :, : self.max_len]  # a view: writes reach the model


class AdvancesBeforeValidation(StaticDecoder):
    """The position counter is advanced before the step's tokens are checked (HF's cache_position), so a
    rejected step still moves every later token one position on."""

    def prefill(self, prompts):
        out = super().prefill(prompts)
        self.counter = self.lengths.clone()
        return out

    def step(self, tokens):
        if self.lengths is not None:
            self.counter = self.counter + 1
        return super().step(tokens)

    def next_positions(self):
        return (self.counter - 1)[:, None].clamp(max=self.model.cfg.block_size - 1)  # (B, 1)


class ClearsCacheBeforeValidation(StaticDecoder):
    """prefill wipes the cache (refilled with NaN, as gpt-fast's setup_caches does on every generate) before it
    checks the prompts, so a rejected prefill erases the live batch's keys and values while its lengths survive."""

    @torch.inference_mode()
    def prefill(self, prompts):
        if self.lengths is not None:
            self.cache.fill_(float("nan"))
        return super().prefill(prompts)


MUTANTS = {
    "positions_restart": (PositionsRestart, "decode positions restart at 0 after the prompt",
                          "prefill_then_steps_equal_forward"),
    "write_one_slot_late": (WritesOneSlotLate, "the new token is written one slot late, leaving a hole",
                            "prefill_then_steps_equal_forward"),
    "appends_twice": (AppendsTwice, "each decode step appends its keys/values to the cache twice",
                      "prefill_then_steps_equal_forward"),
    "gqa_modulo": (ModuloGQA, "GQA maps query head h to kv head h % Hkv instead of h // (H / Hkv)",
                   "gqa_equals_mha_with_repeated_kv"),
    "mask_ignores_cache_length": (MaskIgnoresCacheLength, "the mask uses the batch's longest length, "
                                  "not each sequence's own", "ragged_batch_equals_alone"),
    "reads_unwritten_slots": (ReadsUnwrittenSlots, "decode attends over every preallocated slot",
                              "unused_slots_never_leak"),
    "sized_for_the_prompt": (SizedForThePrompt, "the cache holds the prompt plus 8 tokens; later tokens "
                             "overwrite its last slot", "long_sequences_cross_cache_blocks"),
    "keeps_cache_across_prefill": (KeepsCacheAcrossPrefill, "a second prefill of the same batch size appends "
                                   "to the previous batch's cache", "every_prefill_starts_a_new_batch"),
    "sliding_window": (SlidingWindow, "a leftover sliding-window mask: each query sees only the last 24 keys",
                       "long_sequences_cross_cache_blocks"),
    "cache_on_model": (CacheOnModel, "the cache is an attribute of the model, so two decoders of one model share "
                       "it", "decoders_on_one_model_are_independent"),
    "advances_before_validation": (AdvancesBeforeValidation, "the position counter moves before a step's tokens "
                                   "are checked: a rejected step shifts every later position",
                                   "bad_input_is_rejected"),
    "clears_cache_before_validation": (ClearsCacheBeforeValidation, "a prefill wipes the cache before checking its "
                                       "prompts: a rejected one erases the live batch",
                                       "rejected_calls_leave_no_trace"),
}
for _name, (_cls, _bug, _killer) in MUTANTS.items():
    register("kvcache", f"mutant_{_name}", dtypes=("float64", "float32"), mutant=True, bug=_bug,
             killed_by=(_killer,))(_cls)
