"""bitsandbytes' int8 matmul, `bnb.matmul(x, w, state=MatmulLtState(is_training=False), threshold=...)`, the
kernel behind Linear8bitLt at inference.

x is cast to float16 and quantized per token (row absmax / 127), w per output row; the int8 products are
summed, then rescaled.  With a threshold, the input columns holding some |x| >= threshold are taken out of
the int8 product and added back in floating point (LLM.int8()'s decomposition).  float16 only: other inputs
are cast to it before quantization (it warns).  The default state (is_training=True) takes another path on
the CPU, MatMul8bitFp: int8 weights dequantized, float activations, and the threshold ignored.
Dettmers et al. 2022, "LLM.int8()", section 3; bitsandbytes, autograd/_functions.py (MatMul8bitLt) and
backends/default/ops.py (int8_vectorwise_quant, int8_mixed_scaled_mm).
"""

import logging

from harness.contracts.quantized_linear import check_bits, check_inputs, no_tokens_output
from harness.registry import register
from impls.external.common import Library

BNB = Library("bitsandbytes", "bitsandbytes",
              install="pip install --no-deps bitsandbytes (pip would replace torch otherwise)")
THRESHOLD = 6.0


def bnb_matmul(x, w, *, bits, threshold: float):
    check_inputs(x, w, bits)
    check_bits((8,), bits, who="bitsandbytes int8")
    if (empty := no_tokens_output(x, w)) is not None:
        return empty
    bnb = BNB.load()
    state = bnb.MatmulLtState()
    state.is_training = False  # the inference path of Linear8bitLt (eval mode); see the module docstring
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    return bnb.matmul(x, w, state=state, threshold=threshold)  # (..., out)


register("quantized_linear", "bnb_int8", dtypes=("float16",), exact=False, unavailable=BNB.unavailable,
         cite="bitsandbytes MatMul8bitLt without threshold (vector-wise int8)",
         caps={"weight": "channel", "act": "token", "bits": (8,)})(
    lambda x, w, *, bits=8, calib=None: bnb_matmul(x, w, bits=bits, threshold=0.0))
register("quantized_linear", "bnb_llm_int8", dtypes=("float16",), exact=False, unavailable=BNB.unavailable,
         cite="bitsandbytes MatMul8bitLt with threshold 6 (LLM.int8() decomposition)",
         caps={"weight": "channel", "act": "token", "bits": (8,), "outlier_threshold": THRESHOLD})(
    lambda x, w, *, bits=8, calib=None: bnb_matmul(x, w, bits=bits, threshold=THRESHOLD))
