"""HQQ's quantizer, `hqq.core.quantize.Quantizer.quantize(w, nbits, group_size, axis=1, optimize=False,
round_zero=False, bitpack=False, device="cpu")` (hqq 0.2.8.post1), in its min-max form.

Per group of a row (axis=1: runs of group_size consecutive elements; per channel, one group per row; per tensor
channel_wise=False), over the group's own range: inverse scale 1 / s = (2^b - 1) / (max - min), clamped at 2e4
(s >= 5e-5, declared as scale_floor), float zero point z = -min / s (round_zero=False: declared
``zero_point="float"``), codes round(w / s + z) clamped to 0..2^b - 1; its meta holds s (inverted back) and z.
It computes in float32 (w.float()), so only float32 is declared.  With optimize=True (its default) HQQ refines
s and z by a half-quadratic solver that trades the half-step bound for a smaller lp error: that mode is not a
fixed format and is not adapted.  Badri & Shaji 2023, "Half-Quadratic Quantization of Large Machine Learning
Models"; hqq, hqq/core/quantize.py.
"""

import torch

from llm_inference_harness.contracts.quantization import (
    QuantizationCaps,
    Quantized,
    check_format,
    check_inputs,
    scale_shape,
)
from llm_inference_harness.engine.registry import known_failure, register
from llm_inference_harness.impls.external.common import Library

HQQ = Library("hqq", "hqq", install="pip install -e '.[external]' (hqq)")
MIN_MAX = QuantizationCaps(symmetric=False, zero_point="float", bits=(2, 3, 4, 5, 6, 8), scale_floor=1 / 2e4)


@register("quantization", "hqq_min_max", dtypes=("float32",), exact=False, unavailable=HQQ.unavailable,
          cite="HQQ Quantizer.quantize with optimize=False (Badri & Shaji 2023)", caps=MIN_MAX)
def hqq_min_max(w, *, bits, granularity="channel", group_size=None):
    check_inputs(w, bits, granularity, group_size)
    check_format(MIN_MAX, bits, granularity, group_size, who="hqq")
    quantizer = HQQ.load("hqq.core.quantize").Quantizer
    size = {"tensor": None, "channel": w.shape[1], "group": group_size}[granularity]
    codes, meta = quantizer.quantize(w, nbits=bits, channel_wise=granularity != "tensor", group_size=size,
                                     optimize=False, round_zero=False, axis=1, bitpack=False, device="cpu")
    shape = scale_shape(w, granularity, group_size)
    return Quantized(codes.to(torch.int64).reshape(w.shape), meta["scale"].reshape(shape).to(w.dtype),
                     meta["zero"].reshape(shape).to(w.dtype))


TINY_RANGE = dict(
    library="hqq", version="0.2.8.post1",
    what="Quantizer.quantize sets the inverse scale to 1 wherever a group's range max - min is at most 1e-4 ('avoid "
         "small denom values'): such a group gets a step of 1 however small its weights, so every one of them "
         "dequantizes to about the group's minimum (all its information lost), where the 2e4 clamp on the inverse "
         "scale alone would keep a step of 5e-5",
    reproduce="""\
import torch
from hqq.core.quantize import Quantizer
w = torch.linspace(-5e-5, 5e-5, 64).reshape(1, 64)  # a range of 1e-4: 16 levels of 4 bits would resolve it
codes, meta = Quantizer.quantize(w, nbits=4, group_size=64, optimize=False, axis=1, bitpack=False, device="cpu")
assert float(meta["scale"]) == 1.0 and codes.unique().numel() == 1  # one code for all 64 weights
""")
for _prop in ("extreme_magnitudes", "positive_rescaling", "granularity_bounds_nest"):
    known_failure("quantization", "hqq_min_max", _prop, **TINY_RANGE)
