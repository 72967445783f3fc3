"""Quantization experiments on the tiny target model: ``python -m llm_inference_harness.analytic.quant_experiments``.

Outliers after Dettmers et al. 2022 (LLM.int8()), Sec. 4; smoothing after Xiao et al. 2023 (SmoothQuant), Sec. 3.

1. Statistics of one FFN weight matrix and the SNR estimate of a 4-bit grid (step s = max|w| / 7,
   rounding-noise variance s^2 / 12), next to the measured error variance.
2. Test NLL with every Linear of the transformer blocks weight-quantized (absmax, round to nearest) at
   bits {8, 4, 3, 2} x {per tensor, per channel, group 128, group 32}, next to the unquantized target
   and the good draft.  (Embeddings, LayerNorms and the LM head stay in floating point.)
3. The function-preserving outlier injection: one LayerNorm channel x100, the next Linear's column
   / 100 (the NLL does not move), then W8A8 per tensor / per token at 8 and 6 bits, LLM.int8() and
   SmoothQuant on the original and the injected model.
"""

from __future__ import annotations

import argparse
import copy
import math

import torch
import torch.nn as nn

from llm_inference_harness.contracts.quantization import bits_per_weight, dequantize, snr_db
from llm_inference_harness.engine.progress import progress
from llm_inference_harness.engine.registry import get

BITS = (8, 4, 3, 2)
GRANULARITIES = (("per tensor", "tensor", None), ("per channel", "channel", None), ("group 128", "group", 128),
                 ("group 32", "group", 32))
OUTLIER_LAYER, OUTLIER_FACTOR = 0, 100.0
OUTLIER_SCHEMES = (("W8A8 per tensor", "w8a8_tensor", 8), ("W8A8 per token", "w8a8_token", 8),
                   ("W6A6 per tensor", "w8a8_tensor", 6), ("W6A6 per token", "w8a8_token", 6),
                   ("LLM.int8() (threshold 6), 8-bit", "llm_int8", 8),
                   ("LLM.int8() (threshold 6), 6-bit", "llm_int8", 6),
                   ("SmoothQuant a=0.5 per tensor, 8-bit", "smoothquant_tensor", 8),
                   ("SmoothQuant a=0.5 per tensor, 6-bit", "smoothquant_tensor", 6),
                   ("SmoothQuant a=0.5 per token, 8-bit", "smoothquant_token", 8),
                   ("SmoothQuant a=0.5 per token, 6-bit", "smoothquant_token", 6))


def block_linears(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(parent, attribute) of every Linear inside the transformer blocks."""
    found = []
    for block in model.blocks:
        found += [(block.attn, "q"), (block.attn, "kv"), (block.attn, "proj"), (block.mlp, "0"), (block.mlp, "2")]
    return found


def ffn_matrix(model: nn.Module) -> torch.Tensor:
    return model.blocks[0].mlp[0].weight.detach()  # (4 D, D): the first FFN matrix


def weight_statistics(w: torch.Tensor) -> dict[str, float]:
    """max|w|, std, the 4-bit step max/7 with its noise variance s^2/12 and SNR, and the measured ones."""
    step = w.abs().max().item() / 7
    qt = get("quantization", "absmax").fn(w.double(), bits=4, granularity="tensor")
    measured = (dequantize(qt) - w.double()).var().item()
    return {"max|w|": w.abs().max().item(), "std": w.std().item(), "step s = max/7": step,
            "s^2/12": step**2 / 12, "SNR (dB), s^2/12": snr_db(w.var().item(), step),
            "measured error variance": measured, "SNR (dB), measured": 10 * math.log10(w.var().item() / measured)}


@torch.no_grad()
def weight_quantized(model: nn.Module, bits: int, granularity: str, group_size: int | None,
                     quantizer: str = "absmax") -> nn.Module:
    """A copy whose block Linears hold dequantize(quantize(w)) (round to nearest, no calibration)."""
    fn = get("quantization", quantizer).fn
    model = copy.deepcopy(model)
    for parent, name in block_linears(model):
        linear = _get(parent, name)
        w = linear.weight
        linear.weight.copy_(dequantize(fn(w, bits=bits, granularity=granularity, group_size=group_size)))
    return model


class QuantizedLinear(nn.Module):
    """A Linear whose matmul goes through a registered quantized_linear implementation."""

    def __init__(self, linear: nn.Linear, impl: str, bits: int, calib: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.fn, self.bits, self.calib = get("quantized_linear", impl).fn, bits, calib

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fn(x, self.weight, bits=self.bits, calib=self.calib)  # (..., out)
        return y if self.bias is None else y + self.bias


def _set(parent: nn.Module, name: str, module: nn.Module) -> None:
    if name.isalpha():
        setattr(parent, name, module)
    else:
        parent[int(name)] = module


def _get(parent: nn.Module, name: str) -> nn.Module:
    return getattr(parent, name) if name.isalpha() else parent[int(name)]


@torch.no_grad()
def input_absmax(model: nn.Module, docs: list[list[int]]) -> list[torch.Tensor]:
    """Per-channel max|x| of the input of every block Linear over calibration documents (SmoothQuant)."""
    from llm_inference_harness.models.zoo import pad_batch

    stats: list[torch.Tensor | None] = [None] * len(block_linears(model))
    hooks = []
    for i, (parent, name) in enumerate(block_linears(model)):
        def hook(_module, inputs, _out, i=i):
            m = inputs[0].reshape(-1, inputs[0].shape[-1]).abs().amax(dim=0)  # (in,)
            stats[i] = m if stats[i] is None else torch.maximum(stats[i], m)
        hooks.append(_get(parent, name).register_forward_hook(hook))
    try:
        for start in range(0, len(docs), 100):
            model(pad_batch(docs[start : start + 100])[:, :-1])
    finally:
        for h in hooks:
            h.remove()
    return stats


def activation_quantized(model: nn.Module, impl: str, bits: int, calib_docs: list[list[int]]) -> nn.Module:
    """A copy whose block Linears run `impl`; SmoothQuant gets each layer's calibration max|x| as a
    one-row calib tensor (its factors only use the per-channel maxima)."""
    needs_calib = get("quantized_linear", impl).caps.smooth_alpha is not None
    stats = input_absmax(model, calib_docs) if needs_calib else None
    model = copy.deepcopy(model)
    for i, (parent, name) in enumerate(block_linears(model)):
        calib = stats[i][None, :] if stats else None  # (1, in)
        _set(parent, name, QuantizedLinear(_get(parent, name), impl, bits, calib))
    return model


@torch.no_grad()
def inject_outlier(model: nn.Module, layer: int = OUTLIER_LAYER, factor: float = OUTLIER_FACTOR,
                   channel: int | None = None) -> tuple[nn.Module, int]:
    """Scale one channel of block ``layer``'s second LayerNorm (weight and bias) by ``factor`` and divide
    the matching input column of the FFN's first Linear by it: the network computes the same function,
    but that Linear's input now has an outlier channel.  Returns the copy and the channel."""
    model = copy.deepcopy(model)
    block = model.blocks[layer]
    if channel is None:  # the channel whose LayerNorm output is already the largest: an emergent outlier
        channel = int((block.ln_2.weight.abs() + block.ln_2.bias.abs()).argmax())
    block.ln_2.weight[channel] *= factor
    block.ln_2.bias[channel] *= factor
    block.mlp[0].weight[:, channel] /= factor
    return model, channel


def tables(n_docs: int = 200, n_calib_docs: int = 50) -> dict:
    """The experiments on the tiny target: weight statistics, the NLL grid, the outlier table."""
    from llm_inference_harness.models.world import corpus
    from llm_inference_harness.models.zoo import WEIGHTS, load, nll_per_token, test_corpus

    torch.manual_seed(0)
    target, docs = load("target"), test_corpus(n_docs)
    calib_docs = corpus(n_calib_docs, seed=12345)  # not the test seed: calibration never sees test data
    w = ffn_matrix(target)
    injected, channel = inject_outlier(target)  # a modified copy
    bar = progress(total=4 + 2 * len(OUTLIER_SCHEMES) + len(BITS) * len(GRANULARITIES), desc="quantization NLL",
                   unit="model")

    def nll(model) -> float:
        value = nll_per_token(model, docs)
        bar.update(1)
        return value

    with bar:
        outliers = [["float (no quantization)", nll(target), nll(injected)]]
        for label, impl, bits in OUTLIER_SCHEMES:
            quantized = (activation_quantized(m, impl, bits, calib_docs) for m in (target, injected))
            outliers.append([label, *(nll(m) for m in quantized)])
        base = nll(target)
        draft = nll(load("draft_good")) if (WEIGHTS / "draft_good.safetensors").exists() else math.nan
        grid = [[bits, *(nll(weight_quantized(target, bits, gran, g)) for _, gran, g in GRANULARITIES)]
                for bits in BITS]
    return {
        "docs": len(docs), "stats": weight_statistics(w), "channel": channel, "base": base, "draft": draft,
        "granularities": [label for label, _, _ in GRANULARITIES], "nll": grid,
        "bits_per_weight_at_4": [bits_per_weight(4, w.shape[1], gran, g, w.shape[0]) for _, gran, g in GRANULARITIES],
        "d_model": w.shape[1], "outliers": outliers,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m llm_inference_harness.analytic.quant_experiments",
                                description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=200, help="held-out test documents (default 200)")
    p.add_argument("--calib-docs", type=int, default=50, help="calibration documents for SmoothQuant")
    args = p.parse_args(argv)
    t = tables(args.docs, args.calib_docs)
    print("1. Weight statistics of blocks[0].mlp[0].weight (recorded: max |w| 0.323, std 0.067)")
    for key, value in t["stats"].items():
        print(f"   {key:<26} {value:.4g}")
    print(f"\n2. Test NLL (nats/token, {t['docs']} docs), block Linears weight-quantized (absmax, RTN)")
    print(f"   unquantized target {t['base']:.4f}   good draft {t['draft']:.4f}")
    print(f"   {'bits':<6}" + "".join(f"{label:>14}" for label in t["granularities"]))
    for bits, *row in t["nll"]:
        print(f"   {bits:<6}" + "".join(f"{v:>14.4f}" for v in row))
    print("   bits/weight at 4 bits incl. 16-bit scales (FFN matrix): "
          + ", ".join(f"{c:.3f}" for c in t["bits_per_weight_at_4"]))
    print(f"   note: d_model = {t['d_model']}, so group 128 equals per channel for every Linear whose input is "
          "d_model (q, kv, proj, FFN-in); it differs only for the FFN-out Linear (input 4 d_model)")
    print(f"\n3. Outlier injection: block {OUTLIER_LAYER} ln_2 channel {t['channel']} x{OUTLIER_FACTOR:g}, "
          f"FFN-in column / {OUTLIER_FACTOR:g}")
    print(f"   {'scheme':<38}{'original':>12}{'injected':>12}")
    for label, original, injected in t["outliers"]:
        print(f"   {label:<38}{original:>12.4f}{injected:>12.4f}")


if __name__ == "__main__":
    main()
