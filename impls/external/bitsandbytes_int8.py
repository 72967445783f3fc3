"""bitsandbytes' int8 matmul, `bnb.matmul(x, w, state=MatmulLtState(is_training=False), threshold=...)`, the
kernel behind Linear8bitLt at inference (bitsandbytes 0.50.2).

x is cast to float16 and quantized per token (row absmax / 127), w per output row; the int8 products are
summed, then rescaled.  With a threshold, the input columns holding some |x| >= threshold are taken out of
the int8 product and added back in floating point (LLM.int8()'s decomposition, `int8_mixed_scaled_mm`).
Declared: compute_dtype="float16" (a float32 x and w are rounded to float16 first; the output keeps x's
dtype), outlier_compare=">=".  The default state (is_training=True) takes another path on the CPU,
MatMul8bitFp (int8 weights dequantized, float activations, the threshold ignored), so the adapter sets the
inference state that Linear8bitLt.eval() uses.  Empty inputs go to the library as they are.
Dettmers et al. 2022, "LLM.int8()", section 3; bitsandbytes, autograd/_functions.py (MatMul8bitLt) and
backends/default/ops.py (int8_vectorwise_quant, int8_mixed_scaled_mm).
"""

import logging

from llm_inference_harness.contracts.quantized_linear import check_bits, check_inputs
from llm_inference_harness.engine.registry import known_failure, register
from llm_inference_harness.impls.external.common import FIRST_CALL_IMPORTS_S, Library

BNB = Library("bitsandbytes", "bitsandbytes",
              install="pip install --no-deps bitsandbytes (pip would replace torch otherwise)")
THRESHOLD = 6.0


def bnb_matmul(x, w, *, bits, threshold: float):
    check_inputs(x, w, bits)
    check_bits((8,), bits, who="bitsandbytes int8")
    bnb = BNB.load()
    state = bnb.MatmulLtState()
    state.is_training = False  # the inference path of Linear8bitLt (eval mode); see the module docstring
    logger = logging.getLogger("bitsandbytes")
    level = logger.level
    logger.setLevel(logging.ERROR)  # its warning that other dtypes are cast to float16, once per call
    try:
        return bnb.matmul(x, w, state=state, threshold=threshold)  # (..., out)
    finally:
        logger.setLevel(level)


DTYPES = ("float32", "float16")
CAPS = {"weight": "channel", "act": "token", "bits": (8,), "compute_dtype": "float16",
        "call_limit_s": FIRST_CALL_IMPORTS_S}
register("quantized_linear", "bnb_int8", dtypes=DTYPES, exact=False, unavailable=BNB.unavailable,
         cite="bitsandbytes MatMul8bitLt without threshold (vector-wise int8)", caps=CAPS)(
    lambda x, w, *, bits=8, calib=None: bnb_matmul(x, w, bits=bits, threshold=0.0))
register("quantized_linear", "bnb_llm_int8", dtypes=DTYPES, exact=False, unavailable=BNB.unavailable,
         cite="bitsandbytes MatMul8bitLt with threshold 6 (LLM.int8() decomposition)",
         caps={**CAPS, "outlier_threshold": THRESHOLD, "outlier_compare": ">="})(
    lambda x, w, *, bits=8, calib=None: bnb_matmul(x, w, bits=bits, threshold=THRESHOLD))


OUTLIER_WEIGHTS = dict(
    library="bitsandbytes", version="0.50.2",
    what="int8_mixed_scaled_mm multiplies the outlier columns by the int8-dequantized weights, not the float "
         "ones (its own TODO: 'if state.has_fp16_weights: subB = B[:, outlier_cols].t()'), so LLM.int8()'s "
         "decomposition is not exact in the outlier columns: the error grows with |x| there",
    reproduce="""\
import torch, bitsandbytes as bnb
w = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).half()
x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1)).half()
x[:, 2] = torch.tensor([20.0, 30.0, 40.0]).half()  # column 2 holds outliers (|x| >= 6)
x2 = x.clone(); x2[:, 2] *= 2  # still outliers: only the float part of the product may change
def mm(a):
    state = bnb.MatmulLtState(); state.is_training = False
    return bnb.matmul(a, w, state=state, threshold=6.0).float()
change, exact = mm(x2) - mm(x), (x2 - x)[:, [2]].float() @ w[:, [2]].float().T
assert (change - exact).abs().max() > 0.04  # ~2x the float16 spacing at |y| ~ 23: the weights were rounded
""")
for _prop in ("outlier_columns_exact", "error_within_derived_bound", "computes_in_the_declared_dtype"):
    known_failure("quantized_linear", "bnb_llm_int8", _prop, **OUTLIER_WEIGHTS)

LEADING_DIMS = dict(
    library="bitsandbytes", version="0.50.2",
    what="MatMul8bitLt flattens only a 3-d x: a 1-d x (one token) raises IndexError in its row quantization and a "
         "4-d x RuntimeError, where torch's nn.Linear, which Linear8bitLt replaces, takes any (..., in)",
    reproduce="""\
import torch, bitsandbytes as bnb
w, x = torch.randn(4, 8).half(), torch.randn(2, 2, 3, 8).half()
for a, error in ((x[0, 0, 0], IndexError), (x, RuntimeError)):
    state = bnb.MatmulLtState(); state.is_training = False
    try:
        bnb.matmul(a, w, state=state)
        raise AssertionError(f"a {a.dim()}-d x worked")
    except error:
        pass
""")
for _name in ("bnb_int8", "bnb_llm_int8"):
    known_failure("quantized_linear", _name, "any_leading_dims", **LEADING_DIMS)
