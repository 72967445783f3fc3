"""Weight-only quantized linear layer: dequantize the weight, then a floating-point matmul.

y = x @ (q s).T with absmax codes per output channel or per group of g input columns.  Invariant:
|y - x @ w.T| <= sum_k |x_k| s_k / 2 (the weight's rounding error, carried through the sum).
Frantar et al. 2023, "GPTQ", section 2 (round-to-nearest baseline); Dettmers & Zettlemoyer 2023,
"The case for 4-bit precision", section 3 (block-wise scales).
"""

from llm_inference_harness.contracts.quantization import dequantize
from llm_inference_harness.contracts.quantized_linear import check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.quantization.absmax import quantize_absmax


def weight_only_linear(x, w, *, bits=8, calib=None, granularity="channel", group_size=None):
    check_inputs(x, w, bits, calib)
    w_hat = dequantize(quantize_absmax(w, bits, granularity, group_size))  # (out, in), w's dtype
    return x @ w_hat.to(x.dtype).T  # (..., out)


DTYPES = ("float64", "float32")
register("quantized_linear", "weight_only_channel", devices=("cpu", "cuda"), dtypes=DTYPES, exact=False,
         cite="Frantar et al. 2023, GPTQ, section 2 (RTN)", caps={"weight": "channel"})(
    lambda x, w, *, bits=8, calib=None: weight_only_linear(x, w, bits=bits, calib=calib))
register("quantized_linear", "weight_only_g32", devices=("cpu", "cuda"), dtypes=DTYPES, exact=False,
         cite="Dettmers & Zettlemoyer 2023, section 3", caps={"weight": "group", "group_size": 32})(
    lambda x, w, *, bits=8, calib=None: weight_only_linear(x, w, bits=bits, calib=calib, granularity="group",
                                                           group_size=32))
