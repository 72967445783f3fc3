"""ONNX Runtime's CPU kernels of ONNX operators (onnxruntime 1.32.0), each run as a one-node graph:
`DynamicQuantizeLinear` (opset 11) and `Attention` (opset 23).

DynamicQuantizeLinear: per tensor, uint8, s = (max(x, 0) - min(x, 0)) / 255 and z = round(-min(x, 0) / s)
saturated to 0..255, codes round(x / s) + z half to even: the contract's asymmetric 8-bit format exactly.
Attention: softmax(q k^T * scale) v on (B, H, N, d) inputs, GQA when H is a multiple of Hkv; its is_causal
mask is aligned top-left (query i sees key j <= i, the operator's definition; declared
``causal_align="top_left"``).  float32 only (the operator's float16 path computes in float16).  Empty
shapes and scales go to the runtime as they are (it refuses B = 0 and a scale <= 0: recorded below).
ONNX operator specifications (DynamicQuantizeLinear, Attention); onnxruntime, core/providers/cpu.
"""

import functools

import numpy as np
import torch

from llm_inference_harness.contracts.attention import check_inputs as check_attention
from llm_inference_harness.contracts.attention import check_scores_budget
from llm_inference_harness.contracts.quantization import QuantizationCaps, Quantized, check_format, check_inputs
from llm_inference_harness.engine.registry import known_failure, register
from llm_inference_harness.impls.external.common import Library

ORT = Library("onnxruntime", "onnxruntime")
DYNAMIC = QuantizationCaps(symmetric=False, bits=(8,), granularities=("tensor",))


@functools.lru_cache(maxsize=16)
def session(op: str, opset: int, inputs: tuple[str, ...], outputs: tuple[str, ...], **attributes):
    """An InferenceSession of one ``op`` node (float inputs of any shape), built once per signature."""
    ort, onnx = ORT.load(), ORT.load("onnx")
    helper, float32 = onnx.helper, onnx.TensorProto.FLOAT
    node = helper.make_node(op, list(inputs), list(outputs), **attributes)
    types = {"y": onnx.TensorProto.UINT8, "y_zero_point": onnx.TensorProto.UINT8}
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(n, float32, None) for n in inputs],
                              [helper.make_tensor_value_info(n, types.get(n, float32), None) for n in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # the harness measures its own thread use; one is this machine's share
    options.log_severity_level = 3  # its refusals come back as exceptions; not also printed as log lines
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@register("quantization", "ort_dynamic_quantize_linear", dtypes=("float32",), exact=False,
          unavailable=ORT.unavailable, cite="ONNX DynamicQuantizeLinear on onnxruntime's CPU kernel", caps=DYNAMIC)
def ort_dynamic_quantize_linear(w, *, bits, granularity="tensor", group_size=None):
    check_inputs(w, bits, granularity, group_size)
    check_format(DYNAMIC, bits, granularity, group_size, who="onnxruntime DynamicQuantizeLinear")
    run = session("DynamicQuantizeLinear", 11, ("x",), ("y", "y_scale", "y_zero_point"))
    codes, scale, zero = run.run(None, {"x": w.numpy()})
    return Quantized(torch.from_numpy(codes), torch.from_numpy(np.asarray(scale)).reshape(1, 1),
                     torch.from_numpy(np.asarray(zero)).reshape(1, 1))


@register("attention", "ort_attention", dtypes=("float32",), unavailable=ORT.unavailable,
          cite="ONNX Attention (opset 23) on onnxruntime's CPU kernel", caps={"causal_align": "top_left"})
def ort_attention(q, k, v, *, causal=False, scale=None):
    scale = check_attention(q, k, v, scale, causal)
    check_scores_budget("ort_attention", q, k.shape[2])  # its CPU kernel materializes the scores
    run = session("Attention", 23, ("q", "k", "v"), ("out",), is_causal=int(causal), scale=scale)
    (out,) = run.run(None, {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()})
    return torch.from_numpy(out)  # (B, H, Nq, d)


known_failure("quantization", "ort_dynamic_quantize_linear", "extreme_magnitudes", library="onnxruntime",
              version="1.32.0",
              what="DynamicQuantizeLinear computes max(x, 0) - min(x, 0) in float32: for x holding +-3e38 (finite) it "
                   "overflows, and the scale comes back inf",
              reproduce="""\
import numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper
node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info(n, t, None) for n, t in
                           (("y", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.UINT8))])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
run = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
_, scale, _ = run.run(None, {"x": np.array([3e38, -3e38], np.float32)})
assert np.isinf(scale)
""")

ATTENTION_RUN = """\
import numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper
def attention(q, k, v, **attributes):
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "qkv"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    run = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return run.run(None, {"q": q, "k": k, "v": v})[0]
"""
SCALE = dict(library="onnxruntime", version="1.32.0",
             what="its CPU Attention kernel (opset 23) refuses a scale <= 0 at session creation ('scale must be "
                  "greater than 0 if specified'), which the operator's specification does not exclude: scale 0 is "
                  "uniform weights, a negative one reverses them",
             reproduce=ATTENTION_RUN + """\
q = np.ones((1, 1, 2, 4), np.float32)
try:
    attention(q, q, q, scale=0.0)
    raise AssertionError("scale 0 worked")
except Exception as exc:
    assert "scale must be greater than 0" in str(exc)
""")
for _prop in ("matches_reference", "causal_alignment_is_the_declared_one", "long_keys_and_wide_heads",
              "large_logits_stay_finite_and_correct", "key_value_permutation_invariance",
              "rows_are_convex_combinations_of_values", "nan_inputs_propagate"):
    known_failure("attention", "ort_attention", _prop, **SCALE)
known_failure("attention", "ort_attention", "empty_shapes_give_empty_output", library="onnxruntime", version="1.32.0",
              what="its CPU Attention kernel fails on a batch of size 0 instead of returning the empty output",
              reproduce=ATTENTION_RUN + """\
q = np.ones((0, 1, 2, 4), np.float32)
try:
    attention(q, q, q)
    raise AssertionError("an empty batch worked")
except Exception as exc:
    assert "Attention" in str(exc)
""")
