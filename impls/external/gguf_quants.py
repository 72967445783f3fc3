"""GGUF's block quantizers through gguf-py (llama.cpp's Python package): Q8_0 and Q4_0.

Each row is cut into blocks of 32 weights, each block stored as a float16 scale d and 32 codes.
Q8_0: d = max|w| / 127, q = roundf(w / d) in -127..127 (the restricted convention); Q4_0: d = m / -8 for m
the block's element of largest magnitude, q = trunc(w / d + 8.5) - 8 in -8..7 (signed_extreme: m gets -8
exactly, an element near -m is clipped to 7).  Both compute the codes with the float32 d and store fp16(d),
which is what the declared ``scale_dtype="float16"`` accounts for.  gguf-py has no Python quantizer for the
K-quants (Q4_K and the others are dequantize-only), so none is adapted.
llama.cpp, ggml-quants.c (quantize_row_q8_0_ref, quantize_row_q4_0_ref); gguf-py, gguf/quants.py.
"""

import numpy as np
import torch

from llm_inference_harness.contracts.quantization import QuantizationCaps, Quantized, check_format, check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.external.common import Library

GGUF = Library("gguf", "gguf")
BLOCK = 32
Q8_0 = QuantizationCaps(bits=(8,), granularities=("group",), group_sizes=(BLOCK,), scale_dtype="float16")
Q4_0 = QuantizationCaps(bits=(4,), granularities=("group",), group_sizes=(BLOCK,), scale_dtype="float16",
                        code_range="signed_extreme")


def blocks_of(w: torch.Tensor, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """gguf-py's bytes of w, split per block into the float16 scale and the code bytes: (rows, G) and (rows, G, n)."""
    gguf = GGUF.load()
    raw = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType[kind])  # (rows, G * bytes per block) uint8
    raw = raw.reshape(w.shape[0], w.shape[1] // BLOCK, -1)  # (rows, G, 2 + code bytes)
    return raw[..., :2].copy().view(np.float16)[..., 0], raw[..., 2:]


def quantize_gguf(w, bits, granularity, group_size, kind: str, caps: QuantizationCaps) -> Quantized:
    check_inputs(w, bits, granularity, group_size)
    check_format(caps, bits, granularity, group_size, who=f"gguf {kind}")
    rows, cols = w.shape
    d, qs = blocks_of(w, kind)
    if kind == "Q8_0":
        codes = qs.view(np.int8)  # (rows, G, 32)
    else:  # Q4_0: byte i holds element i in its low nibble and element i + 16 in its high one, both offset by 8
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - 8  # (rows, G, 32)
    return Quantized(torch.from_numpy(codes.reshape(rows, cols).copy()), torch.from_numpy(d.astype(np.float32)))


@register("quantization", "gguf_q8_0", dtypes=("float32",), exact=False, unavailable=GGUF.unavailable,
          cite="llama.cpp ggml-quants.c quantize_row_q8_0_ref, through gguf-py", caps=Q8_0)
def gguf_q8_0(w, *, bits, granularity="channel", group_size=None):
    return quantize_gguf(w, bits, granularity, group_size, "Q8_0", Q8_0)


@register("quantization", "gguf_q4_0", dtypes=("float32",), exact=False, unavailable=GGUF.unavailable,
          cite="llama.cpp ggml-quants.c quantize_row_q4_0_ref, through gguf-py", caps=Q4_0)
def gguf_q4_0(w, *, bits, granularity="channel", group_size=None):
    return quantize_gguf(w, bits, granularity, group_size, "Q4_0", Q4_0)
