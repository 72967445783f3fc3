"""KV-cache decoding: prefill vs decode, decode vs batch size, cached vs recompute, the memory roofline, and the
cost of batch invariance.

Models have random weights (speed does not depend on training): the target's shape (d=128, 4 layers,
~0.8M parameters) with a longer context, and a >= 100M-parameter config for the roofline.  Ratios
are measured within one run, so machine load cancels out as far as it can.
"""

import statistics
import time

import torch

from benchmarks.common import DEVICES, median_seconds, require, resolve_device, resolve_impl, sync
from benchmarks.invariance_cost import alternating_ratio, fastest


def setup(*params):
    """asv runs this before every benchmark here: older commits without these modules are skipped."""
    require("llm_inference_harness.contracts.kvcache", "llm_inference_harness.models.gpt")


def decoder_caches() -> list[str]:
    """The caches of the decoder protocol (the tiny GPT's): a model-protocol implementation brings its own model."""
    try:
        from llm_inference_harness.engine.registry import impls
    except ImportError:  # an older commit without the harness: asv skips, nothing crashes
        return []
    return [i.name for i in impls("kvcache") if getattr(i.caps, "speaks", "decoder") == "decoder"
            and i.name != "recompute"]


CACHES = decoder_caches()
VOCAB = 65


def small_model(block_size: int = 1024, n_embd: int = 128):
    """The target's shape (d=128, 4 layers, ~0.8M parameters), or as wide as ``n_embd`` with 32-dim heads."""
    from llm_inference_harness.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    heads = n_embd // 32
    cfg = GPTConfig(vocab_size=VOCAB, block_size=block_size, n_layer=4, n_head=heads, n_kv_head=heads, n_embd=n_embd)
    return GPT(cfg).eval()


def tokens(n: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))  # (B, n)


def generate(decoder, prompts: list[torch.Tensor], n: int) -> None:
    """Greedy generation of n tokens after the prompts."""
    logits = decoder.prefill(prompts)
    for _ in range(n - 1):
        logits = decoder.step(logits.argmax(-1))


class PrefillVsDecode:
    """256 tokens in one prefill call vs the same 256 tokens decoded one step at a time (batch 1)."""

    params = [CACHES, DEVICES]
    param_names = ["impl", "device"]
    timeout = 300

    def setup(self, impl, device):
        resolve_device(device)
        self.make = resolve_impl("kvcache", impl, torch.device(device)).fn
        self.model, self.seq = small_model(), tokens(256)[0]

    def prefill(self):
        self.make(self.model, 256).prefill([self.seq])

    def decode(self):
        decoder = self.make(self.model, 256)
        decoder.prefill([self.seq[:1]])
        for t in self.seq[1:]:
            decoder.step(t[None])

    def time_prefill_256(self, impl, device):
        self.prefill()

    def time_decode_256(self, impl, device):
        self.decode()

    def track_decode_over_prefill(self, impl, device):
        """Per-token cost of decoding one by one over per-token cost of prefill (the same 256 tokens)."""
        return median_seconds(self.decode) / median_seconds(self.prefill)

    track_decode_over_prefill.unit = "ratio"


class DecodeBatch:
    """One decode step at cache length 64 for batch 1...256: per-token cost falls while the step is
    bound by reading the weights, and stops falling where it becomes compute-bound."""

    params = [CACHES, DEVICES, [1, 4, 16, 64, 128, 256]]
    param_names = ["impl", "device", "batch"]
    timeout = 300
    STEPS = 8

    def setup(self, impl, device, batch):
        resolve_device(device)
        self.make = resolve_impl("kvcache", impl, torch.device(device)).fn
        self.model, self.prompts = small_model(128), list(tokens(64, batch))

    def steps(self):
        decoder = self.make(self.model, 64 + self.STEPS)
        logits = decoder.prefill(self.prompts)
        start = time.perf_counter()
        for _ in range(self.STEPS):
            logits = decoder.step(logits.argmax(-1))
        return (time.perf_counter() - start) / self.STEPS

    def track_step_ms(self, impl, device, batch):
        return statistics.median(self.steps() for _ in range(3)) * 1e3

    track_step_ms.unit = "ms"

    def track_us_per_token(self, impl, device, batch):
        """Step time / batch: lower is better; it stops falling where batching stops paying."""
        return statistics.median(self.steps() for _ in range(3)) * 1e6 / batch

    track_us_per_token.unit = "us/token"


class OneThread:
    """Timed with one intra-op thread, restored in teardown (which asv runs even after a skip): on a shared
    2-core machine a second OpenMP thread makes small ops wait for their partner, and both sides of a
    ratio must run alike."""

    def setup(self, *params):
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def teardown(self, *params):
        torch.set_num_threads(self.threads)


def call_seconds(fn, device: torch.device) -> float:
    """One call's seconds: on a CPU the process's CPU time, which a one-thread call does not lose to the other
    processes of a shared machine (its wall time swung 4-6x with their load here); on CUDA synchronized wall time."""
    if device.type == "cuda":
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        return time.perf_counter() - start
    start = time.process_time()
    fn()
    return time.process_time() - start


class CachedVsRecompute(OneThread):
    """Generating n tokens from a 1-token prompt: recompute time / cached time (goal >= 10x at 512, growing
    roughly linearly with n: recompute's step n is a full forward over n tokens, a cached one is not).

    Two widths of the 4-layer model: the target's (d=128, 0.8M parameters), where a cached step is ~150
    eager ops of ~10 us each -- dispatch, not arithmetic -- so the ratio measures PyTorch's per-op
    overhead as much as the cache; and d=256 (3.2M), the smallest width here whose step is not all
    overhead.  Recompute's cost per token grows with the width, a cached step's hardly does.

    A sample is one round: both generations back to back, in an order that flips from one sample to the next,
    each read by `call_seconds` on one thread; asv's repeated samples give the spread.  (Read in wall time, with
    recompute timed once after the cached runs, this ratio jumped between 3.6x and 17x over commits that
    measure 8-10x alike: docs/benchmarks.md.)"""

    params = [CACHES, DEVICES, [64, 128, 256, 512], [128, 256]]
    param_names = ["impl", "device", "n", "width"]
    timeout = 900

    def setup(self, impl, device, n, width):
        super().setup()
        self.device = resolve_device(device)
        self.cached = resolve_impl("kvcache", impl, self.device).fn
        self.recompute = resolve_impl("kvcache", "recompute", self.device).fn
        self.model, self.prompt = small_model(n_embd=width), [tokens(1)[0]]
        self.recompute_first = False

    def track_recompute_over_cached(self, impl, device, n, width):
        runs = {"cached": lambda: generate(self.cached(self.model, n), self.prompt, n),
                "recompute": lambda: generate(self.recompute(self.model, n), self.prompt, n)}
        order = ["recompute", "cached"] if self.recompute_first else ["cached", "recompute"]
        self.recompute_first = not self.recompute_first
        seconds = {name: call_seconds(runs[name], self.device) for name in order}
        return seconds["recompute"] / seconds["cached"]

    track_recompute_over_cached.unit = "speedup"


class MemoryRoofline(OneThread):
    """Batch-1 decode of a ~403M-parameter model (d=4096, 2 layers, 32 heads of 128, float32): weight bytes read
    per step / step time, as a fraction of the read bandwidth of a chain of 4096 x 4096 matrix-vector products
    measured in the same run, same process and thread count, the two timed alternately so that load drifts hit
    both (goal >= 0.85: the whole decoder at the memory roofline).  Layers as wide as Llama-7B's: the narrower
    the layer, the more of a step goes to the per-op costs that do not read weights (at d=2048, 2 layers, this
    measured 0.82-0.86; at d=1024, 8 layers, 0.58-0.75)."""

    params = [CACHES, DEVICES]
    param_names = ["impl", "device"]
    timeout = 600
    ROUNDS = 16

    def setup(self, impl, device):
        from llm_inference_harness.models.gpt import GPT, GPTConfig

        super().setup()
        resolve_device(device)
        self.make = resolve_impl("kvcache", impl, torch.device(device)).fn
        torch.manual_seed(0)
        self.model = GPT(GPTConfig(vocab_size=VOCAB, block_size=256, n_layer=2, n_head=32, n_kv_head=32,
                                   n_embd=4096)).eval()
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters()
                                if p is not self.model.wte.weight)  # a step reads one embedding row
        self.matrices = [torch.randn(4096, 4096) for _ in range(6)]  # 6 x 64 MiB: far beyond any cache
        self.matrix_bytes = sum(w.numel() * w.element_size() for w in self.matrices)

    def chain(self) -> None:
        y = torch.randn(4096)
        for w in self.matrices:
            y = w @ y  # (4096,)

    def bandwidths(self) -> tuple[float, float]:
        """(decode, matvec) bytes/s: medians over ROUNDS alternating decode steps and matvec chains."""
        decoder = self.make(self.model, 16 + self.ROUNDS + 1)
        logits = decoder.prefill([tokens(16)[0]])
        steps, chains = [], []
        for _ in range(self.ROUNDS):
            chains.append(median_seconds(self.chain, repeat=1))
            start = time.perf_counter()
            logits = decoder.step(logits.argmax(-1))
            steps.append(time.perf_counter() - start)
        return self.weight_bytes / statistics.median(steps), self.matrix_bytes / statistics.median(chains)

    def track_fraction_of_matvec_bandwidth(self, impl, device):
        decode, matvec = self.bandwidths()
        return decode / matvec

    track_fraction_of_matvec_bandwidth.unit = "fraction"

    def track_matvec_gb_per_s(self, impl, device):
        return self.bandwidths()[1] / 1e9

    track_matvec_gb_per_s.unit = "GB/s"


class BatchInvarianceCost(OneThread):
    """The cost of batch invariance: generating 16 tokens after 8 ragged prompts of 32-64 tokens with the
    target's shape (d=128, 4 layers), the fixed-order decoder (impls/kvcache/batch_invariant.py) over the
    fastest registered decoder that declares no invariance, timed in turn within one run (median of 5
    rounds' ratios, one intra-op thread)."""

    params = [DEVICES]
    param_names = ["device"]
    timeout = 900
    STEPS = 16

    def setup(self, device):
        from llm_inference_harness.engine.registry import impls

        super().setup()
        resolve_device(device)
        self.model = small_model(block_size=128)
        lengths = torch.randint(32, 65, (8,), generator=torch.Generator().manual_seed(1)).tolist()
        self.prompts = [tokens(n, seed=b)[0] for b, n in enumerate(lengths)]
        self.invariant = resolve_impl("kvcache", "batch_invariant", torch.device(device)).fn
        others = {i.name: i.fn for i in impls("kvcache") if not i.caps.batch_invariant and i.name != "recompute"
                  and device in i.devices and "float32" in i.dtypes}
        self.other = others[fastest(others, self.generate)]

    def generate(self, make) -> None:
        generate(make(self.model, 64 + self.STEPS), self.prompts, self.STEPS)

    def track_batch_invariant_over_fastest(self, device):
        """Higher is dearer: 1.0 means invariance is free."""
        return alternating_ratio(lambda: self.generate(self.invariant), lambda: self.generate(self.other), rounds=5)

    track_batch_invariant_over_fastest.unit = "ratio"
