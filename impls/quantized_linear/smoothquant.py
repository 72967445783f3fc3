"""SmoothQuant: migrate the activations' outliers into the weights, then W8A8.

s_j = max|X_j|^a / max|W_j|^(1-a) from calibration activations X (the call's own x when none are
given); x / s and w * s (w's column j times s_j) compute the same x @ w.T exactly in real arithmetic,
but the smoothed activations' channels are far more even, so per-tensor or per-token int8 scales
fit them.  Xiao et al. 2023, "SmoothQuant", section 4 (eq. 4, migration strength a = 0.5).
"""

import torch

from llm_inference_harness.contracts.quantized_linear import check_inputs, no_tokens_output
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.quantized_linear.w8a8 import w8a8_linear

ALPHA = 0.5


def smoothing_factors(act_absmax: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    """s (in,) = act_absmax^a / max_i|w_ij|^(1-a); 1 where a channel of x or of w is all zero."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"smoothing_factors: alpha must lie in [0, 1], got {alpha!r}")
    w_absmax = w.abs().amax(dim=0)  # (in,)
    ok = (act_absmax > 0) & (w_absmax > 0)
    tiny = torch.finfo(w.dtype).tiny
    return torch.where(ok, act_absmax.clamp(min=tiny) ** alpha / w_absmax.clamp(min=tiny) ** (1 - alpha), 1.0)


def smooth(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The function-preserving transform: (x / s) @ (w * s).T = x @ w.T."""
    return x / s, w * s  # (..., in), (out, in): column j of w times s_j


def smoothquant_linear(x, w, *, bits=8, calib=None, act="tensor", alpha=ALPHA):
    check_inputs(x, w, bits, calib)
    if (empty := no_tokens_output(x, w)) is not None:
        return empty
    w = w.to(x.dtype)
    stats = (x.reshape(-1, x.shape[-1]) if calib is None else calib.to(x.dtype)).abs().amax(dim=0)  # (in,)
    x_s, w_s = smooth(x, w, smoothing_factors(stats, w, alpha))
    return w8a8_linear(x_s, w_s, bits=bits, act=act)  # (..., out)


for _act in ("tensor", "token"):
    register("quantized_linear", f"smoothquant_{_act}", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
             exact=False, cite="Xiao et al. 2023, SmoothQuant, section 4",
             caps={"weight": "channel", "act": _act, "smooth_alpha": ALPHA})(
        lambda x, w, *, bits=8, calib=None, _act=_act: smoothquant_linear(x, w, bits=bits, calib=calib, act=_act))
