"""vLLM's dynamic per-token int8 quantization kernel, `vllm._custom_ops.scaled_int8_quant(x)` (the activation
quantizer of its W8A8 layers): one scale per row, s = max|x| / 127, codes rounded half to even in -127..127
(the restricted convention), scales in float32.
vLLM, csrc/quantization/compressed_tensors/int8_quant_kernels.cu.  CUDA only: skipped elsewhere.
"""

from llm_inference_harness.contracts.quantization import QuantizationCaps, Quantized, check_format, check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.external.common import Library

VLLM = Library("vllm", "vllm", install="a CUDA build: pip install vllm")
PER_TOKEN = QuantizationCaps(bits=(8,), granularities=("channel",))


@register("quantization", "vllm_scaled_int8_quant", devices=("cuda",), dtypes=("float32",), exact=False,
          unavailable=VLLM.unavailable, cite="vLLM _custom_ops.scaled_int8_quant (dynamic per-token int8)",
          caps=PER_TOKEN)
def vllm_scaled_int8_quant(w, *, bits, granularity="channel", group_size=None):
    check_inputs(w, bits, granularity, group_size)
    check_format(PER_TOKEN, bits, granularity, group_size, who="vLLM scaled_int8_quant")
    codes, scales, _ = VLLM.load("vllm._custom_ops").scaled_int8_quant(w.contiguous())  # (rows, cols), (rows, 1)
    return Quantized(codes, scales.reshape(-1, 1).to(w.dtype))
