"""Exact target distributions and greedy continuations for speculative decoding."""

from __future__ import annotations


def autoregressive_distribution(target, prompt, T: int, eos: int | None = None) -> dict[tuple[int, ...], float]:
    """P(first T tokens) of sampling from the target, by expanding every sequence (float64; a sequence
    ends early at eos).  Zero-probability continuations are left out."""
    dist = {(): 1.0}
    for _ in range(T):
        grown: dict[tuple[int, ...], float] = {}
        for seq, prob in dist.items():
            if seq and seq[-1] == eos:
                grown[seq] = prob
                continue
            p = target([[*prompt, *seq]])[0, -1].tolist()
            for token, pt in enumerate(p):
                if pt > 0:
                    grown[(*seq, token)] = prob * pt
        dist = grown
    return dist


def greedy_tokens(target, prompt, T: int, eos: int | None = None) -> list[int]:
    """The target's greedy continuation (argmax, ties to the lowest id), stopping at eos."""
    out: list[int] = []
    while len(out) < T and (not out or out[-1] != eos):
        out.append(int(target([[*prompt, *out]])[0, -1].argmax()))
    return out
