"""compressed-tensors' integer formats (compressed-tensors 0.20.1), the checkpoints vLLM loads: "int-quantized"
(int8 per channel, W8A8 / W8A16) and "pack-quantized" (int4 per group of 128 and others, W4A16, codes packed
into int32 words).

Scales from `compute_dynamic_scales_and_zp(w, QuantizationArgs(num_bits, type="int", symmetric=True,
strategy, group_size))` (per tensor, or per group; a channel is a group of the whole row), codes from
`quantize(w, scale, zero_point, args)`; 4-bit codes then go through `pack_to_int32` and back through
`unpack_from_int32`, the packing vLLM reads.  Symmetric: s = max|w| / ((q_max - q_min) / 2), i.e.
max|w| / 7.5 at 4 bits and / 127.5 at 8 (the full convention), codes -2^(b-1)..2^(b-1) - 1; an all-zero group
gets the scale dtype's eps.  compressed-tensors, quantization/utils/helpers.py (calculate_qparams),
quantization/lifecycle/forward.py, compressors/pack_quantized/helpers.py.
"""

import torch

from llm_inference_harness.contracts.quantization import (
    QuantizationCaps,
    Quantized,
    check_format,
    check_inputs,
    scale_shape,
)
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.external.common import FIRST_CALL_IMPORTS_S, Library

COMPRESSED = Library("compressed-tensors", "compressed_tensors")
INT = QuantizationCaps(bits=(4, 8), code_range="full", call_limit_s=FIRST_CALL_IMPORTS_S)


@register("quantization", "compressed_tensors_int", dtypes=("float32", "bfloat16"), exact=False,
          unavailable=COMPRESSED.unavailable, caps=INT,
          cite="compressed-tensors calculate_qparams + quantize, int-quantized / pack-quantized (vLLM's loaders)")
def compressed_tensors_int(w, *, bits, granularity="channel", group_size=None):
    check_inputs(w, bits, granularity, group_size)
    check_format(INT, bits, granularity, group_size, who="compressed-tensors int")
    quantization = COMPRESSED.load("compressed_tensors.quantization")
    helpers = COMPRESSED.load("compressed_tensors.quantization.utils.helpers")
    forward = COMPRESSED.load("compressed_tensors.quantization.lifecycle.forward")
    size = {"tensor": None, "channel": w.shape[1], "group": group_size}[granularity]
    args = quantization.QuantizationArgs(num_bits=bits, type="int", symmetric=True, group_size=size,
                                         strategy="tensor" if granularity == "tensor" else "group")
    scale, zero = helpers.compute_dynamic_scales_and_zp(w, args, module=None)  # (1,) or (rows, G)
    shape = scale_shape(w, granularity, group_size)
    scale, zero = scale.reshape(shape), zero.reshape(shape)
    codes = forward.quantize(w, scale, zero, args, dtype=torch.int8)  # (rows, cols)
    if bits < 8:  # the pack-quantized format: int32 words, as stored in the checkpoint
        packing = COMPRESSED.load("compressed_tensors.compressors.pack_quantized.helpers")
        codes = packing.unpack_from_int32(packing.pack_to_int32(codes, bits), bits, codes.shape)
    return Quantized(codes, scale)
