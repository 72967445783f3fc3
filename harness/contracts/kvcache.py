"""The KV-cache contract, in two protocols: a cache layout inside the harness's tiny GPT (``speaks="decoder"``), or a
model that runs with its own cache, as transformers models do (``speaks="model"``).

The decoder protocol: prefill a batch of ragged prompts, then decode one token at a time.

    decoder = impl.fn(model: GPT, max_len: int)      # a factory; `model` is a llm_inference_harness.models.gpt.GPT
    logits = decoder.prefill(prompts)                 # prompts: list of B 1-D LongTensors, lengths 1..max_len
                                                      #   -> (B, V): next-token logits after each prompt
    logits = decoder.step(tokens)                     # tokens: (B,) LongTensor, appended to every sequence
                                                      #   at its own next position -> (B, V)

* Exact implementations return, for every sequence b, what ``model(seq_b[None])[0, -1]`` returns for
  the tokens it has seen so far (prompt + stepped tokens), within the earned tolerance of the model's
  dtype; approximate ones (``exact=False``, e.g. a quantized cache) within their own tolerance row.
* Sequences in a batch are independent: row b does not depend on the other prompts or their lengths.
* ``prefill`` starts a new batch (dropping any previous one, and freeing what it held). Two decoders of one
  model are independent: keep the cache on the decoder, not the model. A call that raises leaves the decoder
  as it was. A sequence may hold at most ``max_len <= model.cfg.block_size`` tokens; asking for more raises
  ValueError, as does ``step`` before ``prefill`` or a ``tokens`` of the wrong shape. Logits have the
  model's dtype; inputs and the model (weights, buffers and config) are left unchanged. `CachedDecoder` runs
  under ``torch.inference_mode`` (no autograd bookkeeping on any op of a step), so its logits are inference
  tensors: read them, don't modify them in place.

Plugging in a cache layout: subclass `CachedDecoder` and implement ``allocate(batch)`` and
``attend(layer, q, k, v)`` (store k, v of the tokens at ``self.positions``, then attend with
`masked_attention`) -- the driver handles validation, ragged padding and positions.  Or implement
``prefill``/``step`` from scratch; the properties only see the two calls.

The model protocol (`CausalLM`): the interface of a transformers causal LM called with ``past_key_values``.
The harness plays the generation loop -- it left-pads ragged prompts as transformers' tokenizers do, builds the
attention mask and each token's position -- and the model and its cache do the rest:

    lm = impl.fn(dtype: torch.dtype, seed: int)       # weights drawn from seed (or loaded), in dtype
    cache = lm.new_cache(batch, max_len)               # room for max_len slots per row
    logits, cache = lm(tokens, mask, positions, cache)
        tokens (B, T) LongTensor; mask (B, S) LongTensor of 0/1, S = the slots the cache holds after this call
        (those it held + T): 0 marks a left pad; positions (B, T): each new token's position in its own
        sequence (a pad's is 0) -> logits (B, T, V) in lm.dtype, and the cache for the next call.
        ``cache=None``: the full forward without a cache -- the oracle.
    lm.in_float64(roundtrip=None)                      # the same weights promoted to float64 (the oracle's
                                                       #   model); ``roundtrip(x)``: every key and value the
                                                       #   attention reads goes through it first
    lm.vocab_size, lm.max_positions, lm.dtype, lm.sliding_window (None, or W: a query sees the last W positions,
    itself included)

* Exact implementations return at every real token what ``lm.in_float64()`` returns for that sequence alone in
  one full forward without a cache, within the earned tolerance of lm.dtype (the plain computation: lm's own full
  forward in its dtype); an approximate cache (``exact=False``, ``caps={"kv_format": ...}``) within its own row,
  earned by the float64 forward whose keys and values took the rounding of that format.
* Rows are independent, pads included: a left pad never changes a real token's logits (``caps={"poisons": True}``
  with ``lm.poison(cache, real, value)``: the properties fill every slot holding no real token -- a left pad, or
  one never written -- with keys 0 and values ``value`` after each call, and the logits must not move).  Two caches
  of one model are independent.  Bad input (ids outside the vocabulary, a mask or positions of the wrong shape,
  a mask whose width is not the cache's slots + T, more than max_len slots, batch or max_len out of range) raises
  ValueError/TypeError naming the argument and leaves the cache as it was: `check_model_call` and
  `check_new_cache` do the checks.  ``harness check kvcache --plugin my_model.py:build`` checks a
  function ``build(dtype, seed) -> CausalLM`` declared with ``@declare(caps={"speaks": "model"}, ...)``
  (docs/examples/kvcache_model.py; impls/external/hf_models.py wraps transformers models).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch

from llm_inference_harness.contracts import Rule, Technique, batch_rules, define
from llm_inference_harness.engine.capabilities import BatchedCaps, cap
from llm_inference_harness.engine.guard import ContractViolation, call_limit, check_tensor, guarded_call

if TYPE_CHECKING:  # the registry imports the contracts: they name its record for type checking only
    from llm_inference_harness.engine.registry import Impl


@dataclass(frozen=True)
class KVCacheCaps(BatchedCaps):
    speaks: Literal["decoder", "model"] = cap(
        "decoder", "its protocol: 'decoder', impl(model: GPT, max_len) -> prefill/step over the harness's tiny GPT "
                   "(properties/test_kvcache.py); 'model', impl(dtype, seed) -> CausalLM, a model running with its "
                   "own cache (properties/test_kvcache_models.py); the other protocol's properties skip")
    poisons: bool = cap(False, "model protocol: lm.poison(cache, real, value) fills every stored slot that holds no "
                               "real token (a left pad, or never written), so a property can show a read of one")
    kv_format: Literal["model", "float8_e4m3fn"] = cap(
        "model", "model protocol: what keys and values are stored as; an approximate cache (exact=False) is judged "
                 "against the float64 forward whose keys and values were rounded to this format")


KVCACHE = define(
    Technique(
        name="kvcache",
        signature="kvcache(model: GPT, max_len: int) -> Decoder with .prefill(prompts: list[LongTensor]) -> "
                  "(B, V) and .step(tokens: LongTensor (B,)) -> (B, V); or, speaking the model protocol, "
                  "kvcache(dtype, seed) -> CausalLM: lm(tokens, mask, positions, cache) -> (logits, cache)",
        summary="incremental decoding: prefill ragged prompts, then one token per step, equal to the full forward",
        properties=("llm_inference_harness.properties.test_kvcache",
                    "llm_inference_harness.properties.test_kvcache_models",
                    "llm_inference_harness.properties.test_kvcache_batch"),
        caps=KVCacheCaps,
        reference="recompute",
        rules=(
            Rule("logits", "every sequence's logits are the model's full forward over the tokens it has seen, within "
                           "the earned tolerance of its dtype",
                 ("prefill_then_steps_equal_forward", "unused_slots_never_leak", "long_sequences_cross_cache_blocks",
                  "gqa_equals_mha_with_repeated_kv", "model_prefill_then_steps_equal_forward",
                  "model_padded_and_unused_slots_never_leak", "model_long_sequences_past_the_sliding_window")),
            Rule("independence", "the sequences of a batch are independent, prefill starts a new batch, and two "
                                 "decoders (caches) of one model share nothing",
                 ("every_prefill_starts_a_new_batch", "decoders_on_one_model_are_independent",
                  "ragged_batch_equals_alone", "rows_sharing_leading_tokens_decode_alone",
                  "model_left_padded_batch_equals_alone", "model_caches_on_one_model_stay_apart")),
            Rule("sampling", "decoding through the cache chooses the tokens the recompute oracle chooses with the "
                             "same seed", ("sampling_matches_recompute", "model_sampling_equals_the_oracle")),
            Rule("bad input", "bad prompts and ids, a step before prefill or past max_len raise ValueError, and a "
                              "call that raises leaves the decoder as it was",
                 ("bad_input_is_rejected", "rejected_calls_leave_no_trace",
                  "model_rejected_calls_leave_the_cache_as_it_was")),
            *batch_rules("continuous_batching_is_invariant"),
        ),
    )
)


def speaks(protocol: str) -> Callable[[Impl], str | None]:
    """An `applies` predicate: the property belongs to ``protocol``; the other protocol's implementations skip."""
    def check(impl: Impl) -> str | None:
        if impl.caps.speaks == protocol:
            return None
        other = "properties/test_kvcache_models.py" if impl.caps.speaks == "model" else "properties/test_kvcache.py"
        return f"speaks the {impl.caps.speaks!r} protocol (judged by {other})"
    return check


def single_threaded(test: Callable) -> Callable:
    """Run a property with one intra-op thread: its models are tiny, and on a loaded 2-core machine a second
    OpenMP thread turns every 20 us LayerNorm into ~10 ms of waiting for its partner."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return test(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return run


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over the visible cache slots only.

    q (B, H, T, d); k, v (B, Hkv, S, d); visible (B, T, S) bool, every row with at least one slot.
    Query head h reads kv head h // (H // Hkv).  Slots no query sees are zeroed before any arithmetic,
    so garbage (NaN-filled unused slots) cannot reach the output through 0 * NaN.
    """
    (B, H, T, d), Hkv = q.shape, k.shape[1]
    used = visible.any(dim=1)[:, None, :, None]  # (B, 1, S, 1)
    k, v = torch.where(used, k, 0), torch.where(used, v, 0)
    qg = q.reshape(B, Hkv, H // Hkv, T, d)  # (B, Hkv, G, T, d)
    s = qg @ k[:, :, None].transpose(-1, -2) / math.sqrt(d)  # (B, Hkv, G, T, S)
    s = s.masked_fill(~visible[:, None, None], float("-inf"))
    return (torch.softmax(s, dim=-1) @ v[:, :, None]).reshape(B, H, T, d)  # (B, H, T, d)


class CachedDecoder:
    """The shared driver.  Ragged prompts are right-padded into one (B, Lmax) prefill; pad tokens get
    positions past their prompt, so a cache must never let a real token see them (`self.valid`).
    During ``attend`` the tokens being written are at ``self.positions`` (B, T), ``self.valid`` (B, T)
    marks the real ones, and ``self.lengths`` (B,) counts tokens per sequence before this call."""

    def __init__(self, model, max_len: int) -> None:
        block = model.cfg.block_size
        if not isinstance(max_len, int) or not 1 <= max_len <= block:
            raise ValueError(f"kvcache: max_len must be an int in [1, block_size={block}], got {max_len!r}")
        self.model, self.max_len, self.lengths = model, max_len, None
        self.dtype = next(model.parameters()).dtype

    # -- hooks a cache layout implements ------------------------------------------------------
    def allocate(self, batch: int) -> None:
        raise NotImplementedError

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -- the contract -------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, prompts: list[torch.Tensor]) -> torch.Tensor:
        lengths = check_prompts(prompts, self.model.cfg.vocab_size, self.max_len)
        B, width = len(prompts), int(lengths.max())
        idx = torch.zeros(B, width, dtype=torch.long)  # (B, Lmax), right-padded with token 0
        for b, p in enumerate(prompts):
            idx[b, : len(p)] = p
        self.lengths = torch.zeros(B, dtype=torch.long)
        self.positions = torch.arange(width).expand(B, width)  # (B, Lmax)
        self.valid = self.positions < lengths[:, None]  # (B, Lmax)
        self.allocate(B)
        logits = self.model.forward_with(idx, self.positions, self.attend, checked=True)  # (B, Lmax, V)
        self.lengths = lengths
        return logits[torch.arange(B), lengths - 1]  # (B, V)

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        check_step(tokens, self.lengths, self.model.cfg.vocab_size, self.max_len)
        self.positions = self.next_positions()  # (B, 1)
        self.valid = torch.ones_like(self.positions, dtype=torch.bool)
        logits = self.model.forward_with(tokens[:, None], self.positions, self.attend, checked=True)[:, 0]  # (B, V)
        self.lengths = self.lengths + 1
        return logits

    def next_positions(self) -> torch.Tensor:
        return self.lengths[:, None]  # (B, 1): the new token of sequence b sits at position len_b


def check_prompts(prompts, vocab_size: int, max_len: int) -> torch.Tensor:
    """Validate prompts; return their lengths (B,)."""
    if not isinstance(prompts, list | tuple) or not prompts:
        raise ValueError(f"prefill: prompts must be a non-empty list of 1-D LongTensors, got {type(prompts).__name__}")
    for b, p in enumerate(prompts):
        if not isinstance(p, torch.Tensor) or p.dim() != 1 or p.dtype != torch.long:
            raise ValueError(f"prefill: prompts[{b}] must be a 1-D LongTensor, got {getattr(p, 'shape', type(p))}")
        if not 1 <= len(p) <= max_len:
            raise ValueError(f"prefill: prompts[{b}] has {len(p)} tokens; expected 1..max_len={max_len}")
        if not (0 <= int(p.min()) and int(p.max()) < vocab_size):
            raise ValueError(f"prefill: prompts[{b}] holds token ids outside [0, {vocab_size})")
    return torch.tensor([len(p) for p in prompts], dtype=torch.long)


def check_step(tokens, lengths: torch.Tensor | None, vocab_size: int, max_len: int) -> None:
    if lengths is None:
        raise ValueError("step: call prefill(prompts) first")
    B = len(lengths)
    if not isinstance(tokens, torch.Tensor) or tokens.shape != (B,) or tokens.dtype != torch.long:
        raise ValueError(f"step: tokens must be a LongTensor of shape ({B},), got {getattr(tokens, 'shape', tokens)}")
    if not (0 <= int(tokens.min()) and int(tokens.max()) < vocab_size):
        raise ValueError(f"step: tokens holds ids outside [0, {vocab_size})")
    if int(lengths.max()) >= max_len:
        raise ValueError(f"step: a sequence already holds max_len={max_len} tokens")


def make(impl: Impl, model, max_len: int):
    return guarded_call(impl.fn, model, max_len, arg_names=("model", "max_len"), timeout_s=call_limit(impl))


# id(decoder) -> the prompts of its last prefill, watched through its steps: a decoder that kept views of the
# caller's prompt tensors must not write into them later.  The model is watched whole (weights, buffers,
# configuration) by make and every prefill, not by each step: a step that changed it shows at the next prefill
# of any decoder of that model, and in every later logit.  Bounded: only recent decoders still step.
_PROMPTS: dict[int, list[torch.Tensor]] = {}


def prefill(impl: Impl, decoder, model, prompts: list[torch.Tensor]) -> torch.Tensor:
    """decoder.prefill under guard; the logits must be finite, (B, V), in the model's dtype."""
    out = guarded_call(decoder.prefill, prompts, arg_names=("prompts",), timeout_s=call_limit(impl),
                       hang_owner=impl.fn, watch={"model": model})
    _PROMPTS.pop(id(decoder), None)
    _PROMPTS[id(decoder)] = prompts
    while len(_PROMPTS) > 16:
        del _PROMPTS[next(iter(_PROMPTS))]
    return check_logits(impl, out, len(prompts), model)


def step(impl: Impl, decoder, model, tokens: torch.Tensor) -> torch.Tensor:
    out = guarded_call(decoder.step, tokens, arg_names=("tokens",), timeout_s=call_limit(impl), hang_owner=impl.fn,
                       watch={"prefill's prompts": _PROMPTS.get(id(decoder), [])})
    return check_logits(impl, out, len(tokens), model)


def check_logits(impl: Impl, out, batch: int, model) -> torch.Tensor:
    dtype = next(model.parameters()).dtype
    return check_tensor(out, what=f"{impl.name} logits", shape=(batch, model.cfg.vocab_size), dtype=dtype)


# --- the model protocol ----------------------------------------------------------------------------------------
class CausalLM(Protocol):
    """What an implementation speaking the model protocol returns (the module docstring has the rules)."""

    vocab_size: int
    max_positions: int  # the most positions a sequence may hold (a learned position table's rows)
    dtype: torch.dtype
    sliding_window: int | None  # a query sees the last W positions, itself included; None: all of them

    def new_cache(self, batch: int, max_len: int) -> Any: ...

    def __call__(self, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: Any) -> tuple[torch.Tensor, Any]: ...

    def in_float64(self, roundtrip: Callable[[torch.Tensor], torch.Tensor] | None = None) -> CausalLM: ...


def check_new_cache(batch, max_len, max_positions: int) -> None:
    """ValueError naming ``batch`` or ``max_len`` unless both are ints, batch >= 1, 1 <= max_len <= max_positions."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"new_cache: batch must be an int >= 1, got {batch!r}")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or not 1 <= max_len <= max_positions:
        raise ValueError(f"new_cache: max_len must be an int in [1, max_positions={max_positions}], got {max_len!r}")


def check_model_call(tokens, mask, positions, *, vocab_size: int, max_positions: int, seen: int = 0,
                     batch: int | None = None, max_len: int | None = None) -> None:
    """Validate one call of the model protocol against a cache holding ``seen`` slots of ``batch`` rows (None: any
    batch, no cache) with room for ``max_len``; ValueError naming tokens, mask, positions or max_len otherwise."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long or 0 in tokens.shape:
        raise ValueError(f"tokens must be a non-empty (B, T) LongTensor, got {getattr(tokens, 'shape', type(tokens))}")
    (B, T), S = tokens.shape, seen + tokens.shape[1]
    if batch is not None and B != batch:
        raise ValueError(f"tokens has {B} rows; the cache holds {batch}")
    if not (0 <= int(tokens.min()) and int(tokens.max()) < vocab_size):
        raise ValueError(f"tokens holds ids outside [0, {vocab_size})")
    if not isinstance(mask, torch.Tensor) or mask.dtype not in (torch.long, torch.bool) or mask.shape != (B, S):
        raise ValueError(f"mask must be a ({B}, {S}) LongTensor (the {seen} cached slots + {T} new), got "
                         f"{getattr(mask, 'shape', type(mask))} {getattr(mask, 'dtype', '')}")
    real = mask.bool()
    if not bool(((mask == 0) | (mask == 1)).all()) or not bool(real[:, -1].all()):
        raise ValueError("mask must hold 0 (a left pad) or 1, with every row's last slot real")
    if bool((real[:, :-1] & ~real[:, 1:]).any()):
        raise ValueError("mask must pad on the left: a row's real slots follow all of its pads")
    if max_len is not None and S > max_len:
        raise ValueError(f"this call needs {S} slots; the cache has max_len={max_len}")
    if not isinstance(positions, torch.Tensor) or positions.dtype != torch.long or positions.shape != (B, T):
        raise ValueError(f"positions must be a ({B}, {T}) LongTensor, got {getattr(positions, 'shape', positions)}")
    if not (0 <= int(positions.min()) and int(positions.max()) < max_positions):
        raise ValueError(f"positions must lie in [0, max_positions={max_positions})")


def left_pad(prompts: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the harness sends a model first, as transformers' tokenizers pad a ragged batch: tokens (B, L) with
    ``pad`` on the left of shorter prompts, mask (B, L) 0 there and 1 on real tokens, positions (B, L) counting each
    row's real tokens from 0 (a pad's position is 0)."""
    B, L = len(prompts), max(len(p) for p in prompts)
    tokens = torch.full((B, L), pad, dtype=torch.long)  # (B, L)
    mask, positions = torch.zeros(B, L, dtype=torch.long), torch.zeros(B, L, dtype=torch.long)  # (B, L) each
    for b, p in enumerate(prompts):
        tokens[b, L - len(p):], mask[b, L - len(p):], positions[b, L - len(p):] = p, 1, torch.arange(len(p))
    return tokens, mask, positions


def build_lm(impl: Impl, dtype: torch.dtype, seed: int):
    return guarded_call(impl.fn, dtype, seed, arg_names=("dtype", "seed"), timeout_s=call_limit(impl))


def new_cache(impl: Impl, lm, batch: int, max_len: int):
    return guarded_call(lm.new_cache, batch, max_len, arg_names=("batch", "max_len"), timeout_s=call_limit(impl),
                        hang_owner=impl.fn)


def call_lm(impl: Impl, lm, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache):
    """lm(tokens, mask, positions, cache) under guard: logits (B, T, V) in lm.dtype, finite at every real token."""
    out = guarded_call(lm, tokens, mask, positions, cache, arg_names=("tokens", "mask", "positions"),
                       timeout_s=call_limit(impl), hang_owner=impl.fn)
    if not isinstance(out, tuple) or len(out) != 2:
        raise ContractViolation(f"{impl.name}: returned {type(out).__name__}, expected a tuple (logits, cache)")
    logits, cache = out
    check_tensor(logits, what=f"{impl.name} logits", shape=(*tokens.shape, lm.vocab_size), dtype=lm.dtype,
                 finite=False)
    check_tensor(logits[mask[:, -tokens.shape[1]:].bool()], what=f"{impl.name} logits of real tokens")
    return logits, cache
