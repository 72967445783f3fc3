"""Activation checkpointing on a toy stack h_{t+1} = tanh(h_t W_t), t = 0..L-1, with a hand-written backward.

The forward keeps only the input of every segment of k layers; the backward walks the segments from
last to first, recomputes a segment's k activations from its checkpoint and backpropagates through them.
At most ceil(L/k) checkpoints + k recomputed activations are stored at once, L/k + k when k divides L,
least near k = sqrt(L).  Invariant: recomputation repeats the forward's exact operations on the same
tensors, so the gradients are bit-identical to storing every activation.
Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", Sec. 3 and 4.1.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Grads(NamedTuple):
    dh0: torch.Tensor  # (batch, width): gradient w.r.t. the stack's input
    dW: list[torch.Tensor]  # L x (width, width)
    peak_stored: int  # most activations held at once, as counted by ActivationStore


class ActivationStore:
    """The activations kept for the backward; counts how many are held at once."""

    def __init__(self) -> None:
        self.held: dict[int, torch.Tensor] = {}
        self.peak = 0

    def put(self, t: int, h: torch.Tensor) -> None:
        self.held[t] = h
        self.peak = max(self.peak, len(self.held))

    def drop(self, t: int) -> torch.Tensor:
        return self.held.pop(t)


def layer(h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    return torch.tanh(h @ W)  # (batch, width)


def layer_backward(h_in, h_out, W, dh_out):
    """(dh_in, dW) of h_out = tanh(h_in W), using tanh' = 1 - tanh^2 (needs the layer's output, not its input)."""
    dz = dh_out * (1 - h_out * h_out)  # (batch, width)
    return dz @ W.T, h_in.T @ dz


def stored_grads(h0: torch.Tensor, weights: list[torch.Tensor], dh_out: torch.Tensor) -> Grads:
    """Plain backprop: every activation h_0..h_L stored by the forward."""
    store = ActivationStore()
    store.put(0, h0)
    for t, W in enumerate(weights):
        store.put(t + 1, layer(store.held[t], W))
    dh, dW = dh_out, [None] * len(weights)
    for t in reversed(range(len(weights))):
        dh, dW[t] = layer_backward(store.held[t], store.drop(t + 1), weights[t], dh)
    return Grads(dh, dW, store.peak)


def checkpointed_grads(h0: torch.Tensor, weights: list[torch.Tensor], dh_out: torch.Tensor, *, k: int) -> Grads:
    """Backprop keeping only every k-th activation in the forward and recomputing each segment in the backward."""
    L = len(weights)
    if not (isinstance(k, int) and 1 <= k <= max(L, 1)):
        raise ValueError(f"checkpointed_grads: k must be an int in 1..L={L} (layers per segment), got {k!r}")
    store, h = ActivationStore(), h0
    for t, W in enumerate(weights):
        if t % k == 0:
            store.put(t, h)  # checkpoint: the input of segment t // k
        h = layer(h, W)
    dh, dW = dh_out, [None] * L
    for start in reversed(range(0, L, k)):
        stop = min(start + k, L)
        for t in range(start, stop):  # recompute h_{start+1} .. h_stop from the checkpoint
            store.put(t + 1, layer(store.held[t], weights[t]))
        for t in reversed(range(start, stop)):
            dh, dW[t] = layer_backward(store.held[t], store.drop(t + 1), weights[t], dh)
        store.drop(start)
    return Grads(dh, dW, store.peak)
