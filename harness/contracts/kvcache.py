"""The KV-cache decoding contract: prefill a batch of ragged prompts, then decode one token at a time.

    decoder = impl.fn(model: GPT, max_len: int)      # a factory; `model` is a harness.models.gpt.GPT
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
"""

from __future__ import annotations

import math

import torch

from harness.capabilities import BatchedCaps
from harness.contracts import Technique, define
from harness.guard import call_limit, check_tensor, guarded_call
from harness.registry import Impl

KVCACHE = define(
    Technique(
        name="kvcache",
        signature="kvcache(model: GPT, max_len: int) -> Decoder with .prefill(prompts: list[LongTensor]) -> "
                  "(B, V) and .step(tokens: LongTensor (B,)) -> (B, V)",
        summary="incremental decoding: prefill ragged prompts, then one token per step, equal to the full forward",
        properties=("properties.test_kvcache",),
        caps=BatchedCaps,
        reference="recompute",
    )
)


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
# caller's prompt tensors must not write into them later.  Bounded: only recent decoders still step.
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
                       watch={"model": model, "prefill's prompts": _PROMPTS.get(id(decoder), [])})
    return check_logits(impl, out, len(tokens), model)


def check_logits(impl: Impl, out, batch: int, model) -> torch.Tensor:
    dtype = next(model.parameters()).dtype
    return check_tensor(out, what=f"{impl.name} logits", shape=(batch, model.cfg.vocab_size), dtype=dtype)
