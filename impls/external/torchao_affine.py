"""torchao's affine quantization primitives, and its int8 Linear configurations.

Quantizer: `choose_qparams_affine(w, MappingType.SYMMETRIC, block_size, torch.int8, quant_min, quant_max)`
then `quantize_affine`, with block_size (1, cols) per channel, (1, g) per group, w's shape per tensor and
codes -2^(b-1)..2^(b-1)-1: the scale is max|w| / ((quant_max - quant_min) / 2) = max|w| / 127.5 at 8 bits
(the full convention), never below float32's smallest normal (its eps argument).  Linear layers: `quantize_`
with Int8WeightOnlyConfig (per-row int8 weights, float activations) and Int8DynamicActivationInt8WeightConfig
(per-row weights, per-token activations quantized at run time), both per row in the same convention.
torchao, torchao/quantization/quant_primitives.py and quant_api.py.
"""

import torch

from llm_inference_harness.contracts.quantization import (
    QuantizationCaps,
    Quantized,
    check_format,
    check_inputs,
    scale_shape,
)
from llm_inference_harness.contracts.quantized_linear import check_bits
from llm_inference_harness.contracts.quantized_linear import check_inputs as check_linear_inputs
from llm_inference_harness.engine.registry import known_failure, register
from llm_inference_harness.impls.external.common import FIRST_CALL_IMPORTS_S, Library

TORCHAO = Library("torchao", "torchao", install="pip install --no-deps torchao (pip would replace torch otherwise)")
DTYPES = ("float32", "bfloat16")  # its primitives refuse float64; float16's smallest normal would floor scales
AFFINE = QuantizationCaps(bits=(4, 8), code_range="full", group_sizes=(2, 3, 4, 8, 16, 32, 64, 128),
                          scale_floor=torch.finfo(torch.float32).tiny, call_limit_s=FIRST_CALL_IMPORTS_S)
PER_ELEMENT = QuantizationCaps(bits=(4, 8), code_range="full", granularities=("group",), group_sizes=(1,),
                               scale_floor=torch.finfo(torch.float32).tiny, call_limit_s=FIRST_CALL_IMPORTS_S)


def quantize_torchao(w, bits, granularity, group_size, caps) -> Quantized:
    check_inputs(w, bits, granularity, group_size)
    check_format(caps, bits, granularity, group_size, who="torchao affine")
    primitives = TORCHAO.load("torchao.quantization.quant_primitives")
    rows, cols = w.shape
    block = {"tensor": (rows, cols), "channel": (1, cols), "group": (1, group_size)}[granularity]
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    s, z = primitives.choose_qparams_affine(w, primitives.MappingType.SYMMETRIC, block, torch.int8, quant_min=lo,
                                            quant_max=hi)
    q = primitives.quantize_affine(w, block, s, z, torch.int8, quant_min=lo, quant_max=hi)  # (rows, cols)
    return Quantized(q, s.reshape(scale_shape(w, granularity, group_size)))  # (R, G)


@register("quantization", "torchao_affine", dtypes=DTYPES, exact=False, unavailable=TORCHAO.unavailable,
          cite="torchao quant_primitives: choose_qparams_affine + quantize_affine, MappingType.SYMMETRIC", caps=AFFINE)
def torchao_affine(w, *, bits, granularity="channel", group_size=None):
    return quantize_torchao(w, bits, granularity, group_size, AFFINE)


@register("quantization", "torchao_affine_per_element", dtypes=DTYPES, exact=False, unavailable=TORCHAO.unavailable,
          cite="torchao quant_primitives with block_size (1, 1): one scale per element", caps=PER_ELEMENT)
def torchao_affine_per_element(w, *, bits, granularity="group", group_size=1):
    return quantize_torchao(w, bits, granularity, group_size, PER_ELEMENT)


PER_ELEMENT_BUG = dict(
    library="torchao", version="0.18.0",
    what="choose_qparams_affine with block_size (1, 1) returns one 0-d scale for the whole tensor (its reduction "
         "over no dimension, amax(dim=[]), reduces over all of them), which its own quantize_affine then rejects",
    reproduce="""\
import torch
from torchao.quantization.quant_primitives import MappingType, choose_qparams_affine, quantize_affine
w = torch.randn(4, 8)
s, z = choose_qparams_affine(w, MappingType.SYMMETRIC, (1, 1), torch.int8)
assert s.shape == torch.Size([])  # one scale, not 4 x 8
try:
    quantize_affine(w, (1, 1), s, z, torch.int8)
    raise AssertionError("quantize_affine accepted it")
except RuntimeError as exc:
    assert "invalid for input of size 1" in str(exc)
""")
for _prop in ("error_within_half_step", "codes_in_range", "absmax_round_trips", "long_rows_keep_their_peak",
              "extreme_magnitudes", "positive_rescaling", "all_zero_groups_give_zeros"):  # every one its cases reach
    known_failure("quantization", "torchao_affine_per_element", _prop, **PER_ELEMENT_BUG)


# --- quantized linear layers ---------------------------------------------------------------------------------
def torchao_linear(x, w, *, bits, config: str):
    check_linear_inputs(x, w, bits)
    check_bits(LINEAR_CAPS[config]["bits"], bits, who=f"torchao {config}")
    quantization = TORCHAO.load("torchao.quantization")
    layer = torch.nn.utils.skip_init(torch.nn.Linear, w.shape[1], w.shape[0], bias=False, dtype=w.dtype,
                                     device=w.device)  # no random initialization: the global RNG stays untouched
    with torch.no_grad():
        layer.weight.copy_(w)
    quantization.quantize_(layer, getattr(quantization, config)())
    with torch.no_grad():
        return layer(x)  # (..., out)


LINEAR_CAPS = {
    "Int8WeightOnlyConfig": dict(weight="channel", bits=(8,), code_range="full", call_limit_s=FIRST_CALL_IMPORTS_S),
    "Int8DynamicActivationInt8WeightConfig": dict(weight="channel", act="token", bits=(8,), code_range="full",
                                                  call_limit_s=FIRST_CALL_IMPORTS_S),
}
for _config, _name in (("Int8WeightOnlyConfig", "torchao_int8_weight_only"),
                       ("Int8DynamicActivationInt8WeightConfig", "torchao_int8_dynamic")):
    register("quantized_linear", _name, dtypes=DTYPES, exact=False, unavailable=TORCHAO.unavailable,
             cite=f"torchao quantize_(nn.Linear, {_config}())", caps=LINEAR_CAPS[_config])(
        lambda x, w, *, bits=8, calib=None, _config=_config: torchao_linear(x, w, bits=bits, config=_config))


known_failure("quantized_linear", "torchao_int8_dynamic", "no_tokens_give_an_empty_output", library="torchao",
              version="0.18.0",
              what="a Linear quantized with Int8DynamicActivationInt8WeightConfig raises TypeError on an input with no "
                   "tokens (its per-token activation quantization reaches quantize_affine with zero_point None, "
                   "'unsupported operand type(s) for +'), where nn.Linear returns the empty (0, out) output",
              reproduce="""\
import torch
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
layer = torch.nn.Linear(8, 4, bias=False)
quantize_(layer, Int8DynamicActivationInt8WeightConfig())
try:
    layer(torch.zeros(0, 8))
    raise AssertionError("an empty batch worked")
except TypeError as exc:
    assert "NoneType" in str(exc)
""")
