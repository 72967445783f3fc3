"""An int8 weight-only linear layer, one absmax scale per output channel: a plugin for the quantized_linear
contract (harness/contracts/quantized_linear.py), declaring its scheme (weight="channel", no activation
quantization) so the harness compares it with that scheme's float64 reference.

    harness check quantized_linear --plugin docs/examples/quantized_linear.py:linear
"""

import torch

from llm_inference_harness import declare
from llm_inference_harness.contracts.quantized_linear import check_inputs


@declare(dtypes=("float32", "float64"), devices=("cpu",), exact=False, caps={"weight": "channel"})
def linear(x, w, *, bits=8, calib=None):
    check_inputs(x, w, bits, calib)
    top = 2 ** (bits - 1) - 1
    s = w.abs().amax(dim=1, keepdim=True) / top  # (out, 1)
    codes = torch.round(w / torch.where(s > 0, s, 1)).clamp(-top, top)  # (out, in)
    return x @ (codes * s).to(x.dtype).T  # (..., out)
