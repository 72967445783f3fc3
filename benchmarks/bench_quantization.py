"""Quantization: error, storage and model quality per scheme and bit width; quantized matmul speed, and the cost
of a batch-invariant layer.

track_ metrics are lower-is-better (errors, bits, NLL).  Model metrics need the tiny target's
weights (harness/models/weights) and skip (n/a) without them.
"""

import torch

from benchmarks.common import DEVICES, cuda_warm_up, impl_names, require, resolve_device, resolve_impl, sync
from benchmarks.invariance_cost import alternating_ratio, fastest


def setup(*params):
    """asv runs this before every benchmark here: older commits without these modules are skipped."""
    require("llm_inference_harness.contracts.quantization", "llm_inference_harness.analytic.quant_experiments")


def served(impl, bits: int, granularity: str | None = None, group_size: int | None = None):
    """NotImplementedError (asv: n/a) for a format the implementation does not declare (a library's int8-only
    kernel, GGUF's blocks of 32); implementations of commits before formats were declared serve every one."""
    caps = impl.caps
    widths = getattr(caps, "bits", (bits,))
    if bits not in widths:
        raise NotImplementedError(f"{impl.name} serves bits {widths}")
    if granularity is not None and granularity not in getattr(caps, "granularities", (granularity,)):
        raise NotImplementedError(f"{impl.name} serves granularities {caps.granularities}")
    sizes = getattr(caps, "group_sizes", None)
    if granularity == "group" and sizes is not None and group_size not in sizes:
        raise NotImplementedError(f"{impl.name} serves group sizes {sizes}")
    return impl


def linear_dtype(impl) -> torch.dtype:
    """float32, or the first dtype a layer declares when it declares none (bitsandbytes: float16)."""
    return torch.float32 if "float32" in impl.dtypes else getattr(torch, impl.dtypes[0])


def get_linear(name: str):
    from llm_inference_harness.engine.registry import get

    return get("quantized_linear", name)


QUANTIZERS = impl_names("quantization")
LINEARS = impl_names("quantized_linear")
GRANULARITY = {"tensor": ("tensor", None), "channel": ("channel", None), "group128": ("group", 128),
               "group32": ("group", 32)}
BITS = [8, 4, 3, 2]
NLL_DOCS = 50


class QuantizerError:
    """max|w - dq(q(w))| / max|w| on a seeded (512, 256) Gaussian matrix of the trained target's weight std 0.067."""

    params = [QUANTIZERS, list(GRANULARITY), BITS]
    param_names = ["impl", "granularity", "bits"]

    def setup(self, impl, granularity, bits):
        self.impl = served(resolve_impl("quantization", impl, torch.device("cpu")), bits, *GRANULARITY[granularity])
        self.w = 0.067 * torch.randn(512, 256, generator=torch.Generator().manual_seed(0))

    def track_max_error(self, impl, granularity, bits):
        from llm_inference_harness.contracts.quantization import dequantize

        gran, g = GRANULARITY[granularity]
        w_hat = dequantize(self.impl.fn(self.w, bits=bits, granularity=gran, group_size=g))
        return ((w_hat - self.w).abs().max() / self.w.abs().max()).item()

    track_max_error.unit = "max|w - w_hat| / max|w|"

    def track_rms_error(self, impl, granularity, bits):
        """Root-mean-square error over std(w): what the SNR estimate s^2 / 12 predicts."""
        from llm_inference_harness.contracts.quantization import dequantize

        gran, g = GRANULARITY[granularity]
        w_hat = dequantize(self.impl.fn(self.w, bits=bits, granularity=gran, group_size=g))
        return ((w_hat - self.w).pow(2).mean().sqrt() / self.w.std()).item()

    track_rms_error.unit = "rms(w - w_hat) / std(w)"

    def track_bits_per_weight(self, impl, granularity, bits):
        """Storage including one 16-bit scale (and a b-bit zero point if asymmetric) per group."""
        from llm_inference_harness.contracts.quantization import bits_per_weight

        gran, g = GRANULARITY[granularity]
        return bits_per_weight(bits, 256, gran, g, 512, zero_point=not self.impl.caps.symmetric)

    track_bits_per_weight.unit = "bits/weight"


class LinearError:
    """max|y - x @ w.T| / max|x @ w.T| with x (256, 256) standard normal, optionally with 4 outlier
    columns of magnitude 60 (10x LLM.int8()'s threshold), w (512, 256) Gaussian."""

    params = [LINEARS, [8, 6, 4], [False, True]]
    param_names = ["impl", "bits", "outliers"]

    def setup(self, impl, bits, outliers):
        record = get_linear(impl)
        self.impl = served(resolve_impl("quantized_linear", impl, torch.device("cpu"), str(linear_dtype(record))[6:]),
                           bits)
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(256, 256, generator=g)
        if outliers:
            self.x[:, [3, 70, 150, 201]] *= 60
        self.w = torch.randn(512, 256, generator=g) / 16
        self.x, self.w = self.x.to(linear_dtype(record)), self.w.to(linear_dtype(record))

    def track_max_rel_error(self, impl, bits, outliers):
        exact = self.x.double() @ self.w.double().T
        y = self.impl.fn(self.x, self.w, bits=bits).double()
        return ((y - exact).abs().max() / exact.abs().max()).item()

    track_max_rel_error.unit = "relative"


class LinearTime:
    """One (tokens, 512) x (2048, 512)^T product: each quantized layer, and plain float ("float")."""

    params = [["float", *LINEARS], DEVICES, [16, 1024]]
    param_names = ["impl", "device", "tokens"]
    timeout = 300

    def setup(self, impl, device, tokens):
        self.device = resolve_device(device)
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(tokens, 512, generator=g).to(self.device)
        self.w = (torch.randn(2048, 512, generator=g) / 23).to(self.device)
        if impl == "float":
            self.fn = lambda x, w, bits: x @ w.T
        else:
            record = get_linear(impl)
            dtype = linear_dtype(record)
            self.fn = served(resolve_impl("quantized_linear", impl, self.device, str(dtype)[6:]), 8).fn
            self.x, self.w = self.x.to(dtype), self.w.to(dtype)
        cuda_warm_up(self.device, lambda: self.time_matmul(impl, device, tokens))

    def time_matmul(self, impl, device, tokens):
        self.fn(self.x, self.w, bits=8)
        sync(self.device)

    def track_time_over_float(self, impl, device, tokens):
        """Median time of this layer / median time of x @ w.T, measured in one process (lower is better)."""
        import torch.utils.benchmark as tb

        def median(fn):
            timer = tb.Timer("fn(x, w, bits=8); sync(dev)", globals={"fn": fn, "x": self.x, "w": self.w,
                                                                      "sync": sync, "dev": self.device})
            return timer.blocked_autorange(min_run_time=0.3).median

        return median(self.fn) / median(lambda x, w, bits: x @ w.T)

    track_time_over_float.unit = "ratio"


class ModelNLL:
    """Test NLL (nats/token, 50 held-out documents) of the tiny target with its block Linears quantized."""

    params = [["absmax tensor", "absmax channel", "absmax group128", "absmax group32", *LINEARS], BITS]
    param_names = ["scheme", "bits"]
    timeout = 600

    def setup(self, scheme, bits):
        from llm_inference_harness.analytic.quant_experiments import activation_quantized, weight_quantized
        from llm_inference_harness.models.world import corpus
        from llm_inference_harness.models.zoo import WEIGHTS, load, test_corpus

        if not (WEIGHTS / "target.safetensors").exists():
            raise NotImplementedError("the target model's weights are not built")
        target = load("target")
        if scheme.startswith("absmax "):
            gran, g = GRANULARITY[scheme.split()[1]]
            self.model = weight_quantized(target, bits, gran, g)
        else:
            record = served(resolve_impl("quantized_linear", scheme, torch.device("cpu")), bits)  # the model is float32
            self.model = activation_quantized(target, record.name, bits, corpus(50, seed=12345))
        self.docs = test_corpus(NLL_DOCS)

    def track_nll(self, scheme, bits):
        from llm_inference_harness.models.zoo import nll_per_token

        return nll_per_token(self.model, self.docs)

    track_nll.unit = "nats/token"


class BatchInvarianceCost:
    """The cost of batch invariance: the fixed-order weight-only layer (impls/quantized_linear/batch_invariant.py)
    over the fastest registered quantized layer that declares no invariance, on 64 tokens of (64, 512) x
    (2048, 512)^T at 8 bits, timed in turn within one run (median of 7 rounds' ratios)."""

    params = [DEVICES]
    param_names = ["device"]
    timeout = 600

    def setup(self, device):
        from llm_inference_harness.engine.registry import impls

        self.device = resolve_device(device)
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 512, generator=g).to(self.device)
        self.w = (torch.randn(2048, 512, generator=g) / 23).to(self.device)
        self.invariant = resolve_impl("quantized_linear", "batch_invariant", self.device).fn
        others = {i.name: i.fn for i in impls("quantized_linear") if not i.caps.batch_invariant
                  and self.device.type in i.devices and "float32" in i.dtypes}
        self.other = others[fastest(others, lambda fn: (fn(self.x, self.w, bits=8), sync(self.device)))]

    def track_batch_invariant_over_fastest(self, device):
        """Higher is dearer: 1.0 means invariance is free."""
        return alternating_ratio(lambda: self.invariant(self.x, self.w, bits=8),
                                 lambda: self.other(self.x, self.w, bits=8), device=self.device)

    track_batch_invariant_over_fastest.unit = "ratio"
