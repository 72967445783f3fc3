"""Properties of activation checkpointing on the toy stack h_{t+1} = tanh(h_t W_t) (harness/analytic/checkpointing.py).

Checkpointing trades compute for memory and must change nothing else: gradients bit-identical to
storing every activation, and a stored-activation count (counted by the code's ActivationStore) of
L/k + k, least near k = sqrt(L).
"""

import math

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from llm_inference_harness.analytic.checkpointing import checkpointed_grads, layer, stored_grads
from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY
from llm_inference_harness.strategies.checkpointing import TanhStackCase, tanh_stack_cases


def peak_stored(L: int, k: int) -> int:
    """The counted peak for an L-layer stack (the count depends on shapes only, not on values)."""
    h, W = torch.zeros(1, 1), torch.zeros(1, 1)
    return checkpointed_grads(h, [W] * L, h, k=k).peak_stored


@given(case=tanh_stack_cases())
@example(case=TanhStackCase(L=6, k=2, batch=33, width=4, dtype="float32", seed=0))  # review: recompute as (W^T h^T)^T
def test_checkpointed_gradients_are_bit_identical_to_storing_everything(case):
    h0, weights, dh_out = case.tensors()
    full, ckpt = stored_grads(h0, weights, dh_out), checkpointed_grads(h0, weights, dh_out, k=case.k)
    assert torch.equal(ckpt.dh0, full.dh0), f"dh0 differs with k={case.k}"
    for t, (a, b) in enumerate(zip(ckpt.dW, full.dW, strict=True)):
        assert torch.equal(a, b), f"dW[{t}] differs with k={case.k}: max {(a - b).abs().max().item():.3g}"


@given(case=tanh_stack_cases(dtypes=("float64",)))
def test_hand_written_backward_matches_autograd(case):
    """The stack's backward is the gradient of sum(h_L * dh_out), as torch.autograd computes it (float64)."""
    h0, weights, dh_out = case.tensors()
    leaves = [t.clone().requires_grad_() for t in (h0, *weights)]
    h = leaves[0]
    for W in leaves[1:]:
        h = layer(h, W)
    expected = torch.autograd.grad((h * dh_out).sum(), leaves)
    ours = checkpointed_grads(h0, weights, dh_out, k=case.k)
    for name, a, b in zip(["dh0", *(f"dW[{t}]" for t in range(case.L))], [ours.dh0, *ours.dW], expected, strict=True):
        err = (a - b).abs().max().item()
        assert err <= FLOAT64_IDENTITY * max(1.0, b.abs().max().item()), f"{name} off autograd by {err:.3g}"


@given(L=st.integers(1, 48), data=st.data())
def test_stored_activations_are_L_over_k_plus_k(L, data):
    """With k dividing L: L/k checkpoints + the k activations of the segment being recomputed."""
    k = data.draw(st.sampled_from([k for k in range(1, L + 1) if L % k == 0]), label="k")
    assert peak_stored(L, k) == L // k + k
    assert stored_grads(torch.zeros(1, 1), [torch.zeros(1, 1)] * L, torch.zeros(1, 1)).peak_stored == L + 1


@given(L=st.integers(1, 64))
def test_fewest_stored_activations_near_sqrt_L(L):
    peaks = {k: peak_stored(L, k) for k in range(1, L + 1)}
    best = [k for k, p in peaks.items() if p == min(peaks.values())]
    assert any(math.floor(math.sqrt(L)) <= k <= math.ceil(math.sqrt(L)) for k in best), (
        f"L={L}: fewest stored activations at k={best}, not near sqrt(L)={math.sqrt(L):.2f}")


def test_worked_example_16_layers():
    """A worked example of sqrt(L) segments (Chen et al. 2016, Sec. 3): L = 16 layers, k = 4 stores 8 activations,
    the fewest of any k (17 without checkpoints)."""
    peaks = {k: peak_stored(16, k) for k in range(1, 17)}
    assert peaks[4] == 8 == min(peaks.values())
    assert peaks[1] == peaks[16] == 17


def test_rejects_bad_segment_length():
    h, W = torch.zeros(1, 1), torch.zeros(1, 1)
    for k in (0, 5, 2.0):
        try:
            checkpointed_grads(h, [W] * 4, h, k=k)
        except ValueError as exc:
            assert "k must be" in str(exc)
        else:
            raise AssertionError(f"k={k!r} accepted for a 4-layer stack")
