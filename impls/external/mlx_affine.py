"""MLX's affine quantization on its CPU build (mlx 0.32.4, `pip install "mlx[cpu]"` on Linux):
`mx.quantize(w, group_size, bits)` -> (packed codes, scales, biases), `w_hat = q * scale + bias` per group.

Groups of 32, 64 or 128 consecutive elements of a row (it refuses other sizes, and any other granularity is a
group of the whole row only when the row has such a length: declared as groups only), 2-6 or 8 bits, scales
and biases in w's dtype.  Its rule (declared ``zero_point="float_edge"``): over the group's range [min, max],
the end e of larger magnitude is made exact, s = e / round(e / s0) with s0 = (max - min) / (2^b - 1) signed
so that e / s0 <= 0, and bias = e; the contract's zero point is then z = -bias / s (a float, in code units),
and s may be negative.  Codes are packed little-endian into uint32 words, 32 / b codes a word where b divides
32 (2, 4, 8 bits), across word boundaries otherwise (3, 5, 6 bits); the adapter unpacks them bit by bit.
MLX, mlx/ops.cpp (quantize, affine_quantize) and python/src/ops.cpp (its documentation).
"""

import numpy as np
import torch

from llm_inference_harness.contracts.quantization import QuantizationCaps, Quantized, check_format, check_inputs
from llm_inference_harness.engine.registry import known_failure, register
from llm_inference_harness.impls.external.common import Library

MLX = Library("mlx", "mlx.core", install="pip install 'mlx[cpu]' (its Linux CPU build)")
AFFINE = QuantizationCaps(symmetric=False, zero_point="float_edge", bits=(2, 3, 4, 5, 6, 8), granularities=("group",),
                          group_sizes=(32, 64, 128))


def unpack(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """(rows, count) codes from (rows, words) little-endian uint32 words holding ``bits``-bit codes back to back."""
    stream = np.unpackbits(words.astype("<u4").view(np.uint8), axis=-1, bitorder="little")  # (rows, 32 * words)
    codes = stream[:, : count * bits].reshape(words.shape[0], count, bits)  # (rows, count, bits)
    return (codes.astype(np.int64) << np.arange(bits)).sum(axis=-1)  # (rows, count)


@register("quantization", "mlx_affine", dtypes=("float32",), exact=False, unavailable=MLX.unavailable,
          cite="MLX mx.quantize (affine mode), CPU build", caps=AFFINE)
def mlx_affine(w, *, bits, granularity="group", group_size=None):
    check_inputs(w, bits, granularity, group_size)
    check_format(AFFINE, bits, granularity, group_size, who="mlx affine")
    mx = MLX.load()
    packed, scales, biases = mx.quantize(mx.array(w.numpy()), group_size=group_size, bits=bits)  # (rows, words)
    scale = torch.from_numpy(np.array(scales))  # (rows, G)
    codes = torch.from_numpy(unpack(np.array(packed), bits, w.shape[1]))  # (rows, cols)
    zero = -torch.from_numpy(np.array(biases)).double() / scale.double()  # (rows, G): code units
    return Quantized(codes, scale, zero.to(w.dtype))


known_failure("quantization", "mlx_affine", "extreme_magnitudes", library="mlx", version="0.32.4",
              what="affine quantize computes the group's range max - min in w's dtype: a float32 group holding "
                   "+-3e38 overflows it to inf, and the scale comes back -inf (with bias 0), where "
                   "max / n - min / n is finite",
              reproduce="""\
import numpy as np, mlx.core as mx
w = np.zeros((1, 32), np.float32)
w[0, :2] = 3e38, -3e38  # finite float32 values
_, scales, biases = mx.quantize(mx.array(w), group_size=32, bits=8)
assert np.isinf(np.array(scales)).all()
""")
