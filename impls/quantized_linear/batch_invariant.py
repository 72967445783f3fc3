"""Batch-invariant weight-only linear layer: absmax codes per output channel, dequantized, then a matmul whose
dot products add their in-features in one fixed order (harness/numerics/fixed_order.py).

The weight's scales come from the weight alone and nothing is computed from the activations, so token i's
output depends on token i only: not on the number of tokens (M), the others, their order or the thread
count -- unlike a BLAS GEMM, which picks its kernel by M.  Invariant: y[i] is bit-identical to the same
call on x[i] alone.  Frantar et al. 2023, "GPTQ", section 2 (round-to-nearest); He et al. 2025, "Defeating
Nondeterminism in LLM Inference" (batch-invariant matmul: no split-K, one order for every M).
"""

from llm_inference_harness.contracts.quantization import dequantize
from llm_inference_harness.contracts.quantized_linear import check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.quantization.absmax import quantize_absmax
from llm_inference_harness.numerics.fixed_order import linear


def batch_invariant_linear(x, w, *, bits=8, calib=None):
    check_inputs(x, w, bits, calib)
    w_hat = dequantize(quantize_absmax(w, bits, "channel")).to(x.dtype)  # (out, in)
    return linear(x, w_hat)  # (..., out)


register("quantized_linear", "batch_invariant", devices=("cpu", "cuda"), dtypes=("float64", "float32"), exact=False,
         cite="Frantar et al. 2023, GPTQ, section 2 (RTN); He et al. 2025 (batch-invariant matmul)",
         caps={"weight": "channel", "batch_invariant": True, "deterministic": True})(batch_invariant_linear)
