"""optimum-quanto's weight quantizers (optimum-quanto 0.2.7): `quantize_weight(w, qtype, axis=0, scale, shift,
group_size, optimized=False)` with the scales its optimizers choose, the path `quantize(model, weights=...)`
takes for a Linear layer's weight.

qint8: AbsmaxOptimizer, per output row (axis 0; quanto refuses group sizes for 8-bit types), s = max|w| / 127
(the restricted convention), codes round(w / s) in -128..127.  qint4 / qint2: MaxOptimizer per group of
group_size consecutive elements of a row, over the group's own range, s = (max - min) / (2^b - 1) and a float
shift = -min, codes round((w + shift) / s) in 0..2^b - 1, w_hat = q s - shift: the contract's float zero point
z = shift / s (declared ``zero_point="float"``; 0 where s = shift = 0, an all-zero group).  A group of one
element has s = 0 and its value in the shift, which no (q - z) s holds: group size 1 is declared excluded.  The
codes are read from quanto's PackedTensor bytes here (`PackedTensor.unpack` on the CPU JIT-compiles a C++
extension first: minutes with a compiler, a hang without).
optimum-quanto, tensor/optimizers/{absmax,max}_optimizer.py, library/quantize.py, tensor/weights/quantization.py.
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
from llm_inference_harness.impls.external.common import FIRST_CALL_IMPORTS_S, Library

QUANTO = Library("optimum-quanto", "optimum.quanto")
QINT8 = QuantizationCaps(bits=(8,), granularities=("channel",), call_limit_s=FIRST_CALL_IMPORTS_S)
QINT4 = QuantizationCaps(symmetric=False, zero_point="float", bits=(2, 4), granularities=("group",),
                         excluded_group_sizes=(1,), call_limit_s=FIRST_CALL_IMPORTS_S)


def unpacked(packed: torch.Tensor, bits: int, rows: int) -> torch.Tensor:
    """The uint8 codes quanto's pack_weights packs: byte row i holds rows i, i + R, i + 2R... of the (rows, g) codes
    at bit offsets 0, bits, 2 bits..., R = the packed rows."""
    parts = [(packed >> (bits * i)) & (2**bits - 1) for i in range(8 // bits)]  # each (R, g)
    return torch.cat(parts)[:rows]  # (rows, g)


def qtype_of(quanto, bits: int):
    return {8: quanto.qint8, 4: quanto.qint4, 2: quanto.qint2}[bits]


@register("quantization", "quanto_qint8", dtypes=("float32",), exact=False, unavailable=QUANTO.unavailable,
          cite="optimum-quanto quantize_weight(qint8) with AbsmaxOptimizer", caps=QINT8)
def quanto_qint8(w, *, bits, granularity="channel", group_size=None):
    check_inputs(w, bits, granularity, group_size)
    check_format(QINT8, bits, granularity, group_size, who="quanto qint8")
    quanto = QUANTO.load()
    optimizers = QUANTO.load("optimum.quanto.tensor.optimizers")
    scale = optimizers.AbsmaxOptimizer()(w, qtype_of(quanto, bits), axis=0)  # (rows, 1)
    qt = quanto.quantize_weight(w, qtype=qtype_of(quanto, bits), axis=0, scale=scale, optimized=False)
    return Quantized(qt._data, qt._scale.reshape(w.shape[0], 1))


@register("quantization", "quanto_qint4", dtypes=("float32",), exact=False, unavailable=QUANTO.unavailable,
          cite="optimum-quanto quantize_weight(qint4 / qint2) with MaxOptimizer", caps=QINT4)
def quanto_qint4(w, *, bits, granularity="group", group_size=None):
    check_inputs(w, bits, granularity, group_size)
    check_format(QINT4, bits, granularity, group_size, who="quanto qint4")
    quanto = QUANTO.load()
    optimizers = QUANTO.load("optimum.quanto.tensor.optimizers")
    qtype = qtype_of(quanto, bits)
    scale, shift = optimizers.MaxOptimizer()(w, qtype, axis=0, group_size=group_size)  # (rows * G, 1) each
    qt = quanto.quantize_weight(w, qtype=qtype, axis=0, scale=scale, shift=shift, group_size=group_size,
                                optimized=False)
    shape = scale_shape(w, granularity, group_size)
    grouped = w.numel() // group_size
    codes = unpacked(qt._data._data, bits, grouped).reshape(w.shape).to(torch.int64)  # (rows, cols)
    zero = torch.where(qt._scale != 0, qt._shift / qt._scale, qt._shift)  # shift 0 where s is (all-zero groups)
    return Quantized(codes, qt._scale.reshape(shape), zero.reshape(shape))


ONE_GROUP = dict(
    library="optimum-quanto", version="0.2.7",
    what="AffineOptimizer reads a grouped weight with a single group, (1, group_size), as 'an axis of size 1' and "
         "drops the axis: MaxOptimizer then reduces over dim 0 and returns one scale per element (1, group_size) "
         "instead of one for the group, for any weight whose rows * columns equal the group size",
    reproduce="""\
import torch
from optimum.quanto import qint4
from optimum.quanto.tensor.optimizers import MaxOptimizer
scale, shift = MaxOptimizer()(torch.randn(1, 64), qint4, axis=0, group_size=64)
assert scale.shape == (1, 64)  # one group, 64 scales
assert MaxOptimizer()(torch.randn(2, 64), qint4, axis=0, group_size=64)[0].shape == (2, 1)
""")
for _prop in ("error_within_half_step", "codes_in_range", "zero_point_scales_match_reference", "extreme_magnitudes",
              "requantize_is_identity", "positive_rescaling", "all_zero_groups_give_zeros"):
    known_failure("quantization", "quanto_qint4", _prop, **ONE_GROUP)
