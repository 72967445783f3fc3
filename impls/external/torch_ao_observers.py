"""PyTorch's own eager-mode quantization: torch.ao observers choose the scales, torch.quantize_per_channel
(or per_tensor) rounds.

PerChannelMinMaxObserver / MinMaxObserver with the symmetric qschemes and qint8: s = max|w| / ((127 - -128) / 2)
= max|w| / 127.5 (the full convention), floored at float32's eps, zero point 0; codes round(w / s) half to
even, clamped to -128..127.  Groups are channels of a (rows * G, g) view.  Only 8 bits: quantize_per_channel
clamps to qint8's range, not to an observer's narrower quant_min/quant_max.
PyTorch, torch/ao/quantization/observer.py (_calculate_qparams).
"""

import warnings

import torch

from llm_inference_harness.contracts.quantization import (
    QuantizationCaps,
    Quantized,
    check_format,
    check_inputs,
    scale_shape,
)
from llm_inference_harness.engine.registry import register

OBSERVED = QuantizationCaps(bits=(8,), code_range="full", scale_floor=torch.finfo(torch.float32).eps)


@register("quantization", "torch_ao_observers", dtypes=("float32",), exact=False,
          cite="torch.ao.quantization PerChannelMinMaxObserver + torch.quantize_per_channel", caps=OBSERVED)
def torch_ao_observers(w, *, bits, granularity="channel", group_size=None):
    from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver

    check_inputs(w, bits, granularity, group_size)
    check_format(OBSERVED, bits, granularity, group_size, who="torch.ao observers")
    shape = scale_shape(w, granularity, group_size)
    with warnings.catch_warnings():  # torch.quantize_per_* warn that quantized dtypes are deprecated
        warnings.simplefilter("ignore", UserWarning)
        if granularity == "tensor":
            observer = MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
            observer(w)
            s, z = observer.calculate_qparams()
            q = torch.quantize_per_tensor(w, float(s), int(z), torch.qint8).int_repr()  # (rows, cols)
            return Quantized(q, s.reshape(1, 1).to(w.dtype))
        channels = w.reshape(shape[0] * shape[1], -1)  # (rows * G, g): one observer channel per scale
        observer = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
        observer(channels)
        s, z = observer.calculate_qparams()
        q = torch.quantize_per_channel(channels, s, z, 0, torch.qint8).int_repr()  # (rows * G, g)
    return Quantized(q.reshape(w.shape), s.reshape(shape).to(w.dtype))
