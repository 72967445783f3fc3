"""Paged attention vs contiguous decode attention, the cost of batch invariance, and the serving simulator's
metrics per memory policy.

The paged/contiguous ratio is measured in one process (track_paged_over_contiguous; goal <= 1.25);
the simulator's track_ values move on the dashboard whenever a policy or a block manager changes.
"""

import torch

from benchmarks.common import DEVICES, cuda_warm_up, impl_names, require, resolve_device, resolve_impl, sync
from benchmarks.invariance_cost import alternating_ratio, fastest


def setup(*params):
    """asv runs this before every benchmark here: older commits without these modules are skipped."""
    require("llm_inference_harness.contracts.paged_attention", "llm_inference_harness.analytic.simulator.report")


PAGED = impl_names("paged_attention")
CACHE_LENS = [256, 1024, 4096]
B, H, HKV, D, BLOCK = 8, 32, 8, 128, 16  # a decode batch of Llama-3-8B-shaped heads (GQA 4:1)


def decode_inputs(cache_len: int, device: torch.device):
    """q (B, H, 1, d); contiguous k, v (B, Hkv, N, d); the same K/V in a shuffled block pool."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 1, D, generator=g)
    k, v = (torch.randn(B, HKV, cache_len, D, generator=g) for _ in range(2))
    n = cache_len // BLOCK
    tables = torch.randperm(B * n, generator=g).reshape(B, n)  # (B, blocks): physical order shuffled
    k_cache, v_cache = (torch.empty(B * n, HKV, BLOCK, D) for _ in range(2))
    for cache, t in ((k_cache, k), (v_cache, v)):
        cache[tables.reshape(-1)] = t.reshape(B, HKV, n, BLOCK, D).transpose(1, 2).reshape(B * n, HKV, BLOCK, D)
    seq_lens = torch.full((B,), cache_len)
    to = lambda *ts: [t.to(device) for t in ts]
    return to(q, k, v), to(q, k_cache, v_cache, tables, seq_lens)


def _median(stmt_globals: dict, stmt: str) -> float:
    import torch.utils.benchmark as tb

    return tb.Timer(stmt, globals=stmt_globals).blocked_autorange(min_run_time=0.5).median


class PagedDecodeAttention:
    params = [PAGED, DEVICES, CACHE_LENS]
    param_names = ["impl", "device", "cache_len"]
    timeout = 300

    def setup(self, impl, device, cache_len):
        self.device = resolve_device(device)
        self.fn = resolve_impl("paged_attention", impl, self.device).fn
        self.sdpa = resolve_impl("attention", "sdpa", self.device).fn
        self.contiguous, self.paged = decode_inputs(cache_len, self.device)
        cuda_warm_up(self.device, lambda: self.time_paged_decode(impl, device, cache_len))

    def time_paged_decode(self, impl, device, cache_len):
        self.fn(*self.paged)
        sync(self.device)

    def track_paged_over_contiguous(self, impl, device, cache_len):
        """Paged decode time / contiguous (SDPA) decode time on the same K/V, in one process (goal <= 1.25)."""
        env = {"fn": self.fn, "sdpa": self.sdpa, "paged": self.paged, "contiguous": self.contiguous,
               "sync": sync, "dev": self.device}
        return _median(env, "fn(*paged); sync(dev)") / _median(env, "sdpa(*contiguous); sync(dev)")

    track_paged_over_contiguous.unit = "ratio"


POLICIES = ["reserve_max", "oracle", "paged16", "paged16_swap"]


class ServingSimulator:
    """Scenarios (a) and (b) under each policy, simulated once per run (about 10 s of CPU)."""

    params = [POLICIES, ["a", "b"]]
    param_names = ["policy", "scenario"]
    timeout = 300

    def setup_cache(self):
        from llm_inference_harness.analytic.simulator.report import run_scenario

        return {(m.policy, s): m for s in ("a", "b") for m in run_scenario(s)}

    def track_utilization(self, results, policy, scenario):
        """Tokens stored / budget, averaged over steps with requests queued (higher is better)."""
        return 100 * results[(policy, scenario)].share("stored")

    track_utilization.unit = "%"

    def track_waste(self, results, policy, scenario):
        """Allocated but not holding a token: reserved-but-unused + internal + external fragmentation."""
        m = results[(policy, scenario)]
        return 100 * (m.share("reserved_unused") + m.share("internal") + m.share("external"))

    track_waste.unit = "%"

    def track_mean_batch(self, results, policy, scenario):
        return results[(policy, scenario)].mean("batch")

    track_mean_batch.unit = "requests"

    def track_steps(self, results, policy, scenario):
        """Decode steps to finish every request (lower is better; throughput = tokens / steps)."""
        return results[(policy, scenario)].steps

    track_steps.unit = "steps"

    def track_throughput_vs_reserve_max(self, results, policy, scenario):
        return results[(policy, scenario)].throughput / results[("reserve_max", scenario)].throughput

    track_throughput_vs_reserve_max.unit = "x"

    def track_recomputed_tokens(self, results, policy, scenario):
        return results[(policy, scenario)].recomputed_tokens

    track_recomputed_tokens.unit = "tokens"


class BatchInvarianceCost:
    """The cost of batch invariance: the fixed-order paged kernel (impls/paged_attention/batch_invariant.py)
    over the fastest registered paged kernel that declares no invariance, on the decode batch above at a
    1024-token cache, timed in turn within one run (median of 7 rounds' ratios)."""

    params = [DEVICES]
    param_names = ["device"]
    timeout = 600

    def setup(self, device):
        from llm_inference_harness.engine.registry import impls

        self.device = resolve_device(device)
        _, self.paged = decode_inputs(1024, self.device)
        self.invariant = resolve_impl("paged_attention", "batch_invariant", self.device).fn
        others = {i.name: i.fn for i in impls("paged_attention") if not i.caps.batch_invariant
                  and self.device.type in i.devices and "float32" in i.dtypes}
        self.other = others[fastest(others, lambda fn: (fn(*self.paged), sync(self.device)))]

    def track_batch_invariant_over_fastest(self, device):
        """Higher is dearer: 1.0 means invariance is free."""
        return alternating_ratio(lambda: self.invariant(*self.paged), lambda: self.other(*self.paged),
                                 device=self.device)

    track_batch_invariant_over_fastest.unit = "ratio"
