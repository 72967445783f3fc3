"""The quantized-linear technique's helpers: a declared scheme that no reference computes is refused, and the
SmoothQuant transform (Xiao et al. 2023) keeps x @ w.T while it shrinks the activations' outlier channels.
"""

import pytest
import torch
from hypothesis import given

from llm_inference_harness.contracts.quantized_linear import Scheme
from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY
from llm_inference_harness.impls.quantized_linear.smoothquant import smooth, smoothing_factors
from llm_inference_harness.references.quantized_linear import smoothing_factors64
from llm_inference_harness.strategies.quantized_linear import smoothing_cases


@pytest.mark.parametrize(("caps", "named"), [({"weight": "rows"}, "weight"), ({"act": "batch"}, "act"),
                                              ({"weight": "group"}, "group_size"),
                                              ({"weight": "group", "group_size": 0}, "group_size")])
def test_declared_scheme_is_validated(caps, named):
    """A plugin's declared scheme that no reference computes is refused, naming the capability."""
    with pytest.raises(ValueError, match=named):
        Scheme(**caps)


# ---------------------------------------------------------------------------------------------
# the SmoothQuant transform
def channel_ratio(x: torch.Tensor) -> float:
    """max over channels of max|X_j|, divided by the min over channels."""
    m = x.abs().amax(dim=0)
    return (m.max() / m.min()).item()


@given(case=smoothing_cases())
def test_smoothing_preserves_the_function(case):
    """(x / s) @ (s * w).T = x @ w.T in float64 for any migration strength a in [0, 1]."""
    x, w, alpha = case
    s = smoothing_factors(x.abs().amax(dim=0), w, alpha)
    assert torch.allclose(s, smoothing_factors64(x.abs().amax(dim=0), w, alpha), rtol=FLOAT64_IDENTITY, atol=0)
    x_s, w_s = smooth(x, w, s)
    err = (x_s @ w_s.T - x @ w.T).abs().max().item()
    scale = max(1.0, (x.abs() @ w.abs().T).max().item())
    assert err <= FLOAT64_IDENTITY * scale, f"smoothing with a = {alpha} changed x @ w.T by {err:.3g}"


@given(case=smoothing_cases(min_alpha=0.25))
def test_smoothing_reduces_the_channel_ratio(case):
    """max|X'_j| = (max|X_j| max|W_j|)^(1-a), so with outlier channels >= 100 / 6 times the rest and weight
    columns within 2x, the activations' max-over-channels ratio shrinks for a >= 1/4
    ((2 R)^(1-a) < R once R > 2^((1-a)/a) = 8)."""
    x, w, alpha = case
    x_s, _ = smooth(x, w, smoothing_factors(x.abs().amax(dim=0), w, alpha))
    law = (x.abs().amax(dim=0) * w.abs().amax(dim=0)) ** (1 - alpha)
    assert torch.allclose(x_s.abs().amax(dim=0), law, rtol=FLOAT64_IDENTITY, atol=0), "smoothed ranges break the law"
    before, after = channel_ratio(x), channel_ratio(x_s)
    assert after < before, f"a = {alpha:.3f}: the channel ratio went {before:.3g} -> {after:.3g}, not down"
