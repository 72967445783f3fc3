"""Full forward passes of a harness GPT (no cache), in float64 and in the model's own dtype."""

from __future__ import annotations

import torch

from llm_inference_harness.references.attention import PLAIN_ORDERS, attention64, attention_plain


def right_padded(seqs: list[torch.Tensor]) -> torch.Tensor:
    """Sequences of any lengths as one (B, Lmax) batch, padded on the right with token 0: under causal attention a
    token never sees a later one, so each row's logits at its own tokens are those of its sequence alone."""
    batch = torch.zeros(len(seqs), max(len(s) for s in seqs), dtype=torch.long)  # (B, Lmax)
    for b, s in enumerate(seqs):
        batch[b, : len(s)] = s
    return batch


def gpt_logits64(model, seqs: list[torch.Tensor], kv_bits: int | None = None) -> list[torch.Tensor]:
    """Logits (n_b, V) of each sequence, weights (as stored) promoted to float64, attention from the definition;
    one batched forward.  ``kv_bits``: round-trip every key/value vector through symmetric absmax integers of that
    many bits first (what a quantized cache stores), so the result is the exact forward of a quantized cache."""
    import copy

    model64 = copy.deepcopy(model).double()

    def attend(layer, q, k, v):
        if kv_bits is not None:
            k, v = _absmax_roundtrip(k, kv_bits), _absmax_roundtrip(v, kv_bits)
        return attention64(q, k, v, causal=True)

    with torch.no_grad():
        logits = model64.forward_with(right_padded(seqs), None, attend)  # (B, Lmax, V)
    return [logits[b, : len(s)] for b, s in enumerate(seqs)]


def gpt_logits_plain(model, seqs: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The full forward in the model's own dtype with attention in each of attention_plain's orders: for each
    order, the logits (n_b, V) of each sequence."""
    batch = right_padded(seqs)  # (B, Lmax)
    with torch.no_grad():
        out = [model.forward_with(batch, None, lambda layer, q, k, v, i=i: attention_plain(q, k, v, causal=True)[i])
               for i in range(PLAIN_ORDERS)]  # (B, Lmax, V) each
    return [[logits[b, : len(s)] for b, s in enumerate(seqs)] for logits in out]


def _absmax_roundtrip(x: torch.Tensor, bits: int) -> torch.Tensor:
    top = 2 ** (bits - 1) - 1
    scale = x.abs().amax(dim=-1, keepdim=True) / top  # one scale per vector
    return torch.where(scale > 0, torch.round(x / torch.where(scale > 0, scale, 1)).clamp(-top, top) * scale, 0)


# --- the model protocol (harness/contracts/kvcache.py, CausalLM) -----------------------------------------------
def lm_forward(lm, seq: torch.Tensor) -> torch.Tensor:
    """Logits (n, V) of one whole sequence: the model's own full forward, no cache, no padding."""
    n = len(seq)
    logits, _ = lm(seq[None], torch.ones(1, n, dtype=torch.long), torch.arange(n)[None], None)
    return logits[0]


def _fp8_roundtrip(shift: int):
    """Keys or values rounded to float8_e4m3fn at one scale for the tensor: absmax / 448 times 2^(shift/4), so the
    largest element lands at or below the format's largest (448) and nothing saturates; each shift moves the
    rounding grid a quarter octave (four draws of what fp8 storage costs, as the four plain attention orders are)."""
    def roundtrip(x: torch.Tensor) -> torch.Tensor:
        scale = x.abs().amax().clamp_min(torch.finfo(x.dtype).tiny) / torch.finfo(torch.float8_e4m3fn).max
        scale = scale * 2 ** (shift / 4)
        return (x / scale).to(torch.float8_e4m3fn).to(x.dtype) * scale
    return roundtrip


# kv_format -> (its tolerance row, the round trips whose float64 forwards earn an approximate cache's tolerance)
KV_FORMATS = {"float8_e4m3fn": ("kv_fp8", tuple(_fp8_roundtrip(shift) for shift in range(4)))}
