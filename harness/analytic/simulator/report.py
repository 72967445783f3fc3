"""Side-by-side tables of the policies on the canned scenarios, next to the numbers recorded when they were written."""

from __future__ import annotations

from llm_inference_harness.analytic.simulator.engine import Metrics, Paged, oracle, reserve_max, simulate
from llm_inference_harness.analytic.simulator.workload import SCENARIOS, Scenario

# Recorded when the scenarios were written (to compare with, not inputs to anything): utilization of
# reserve-max ~28% (vLLM paper: 20-38%), paged ~96-98%, paged waste ~1%, mean batch 32 -> 134, ~2.2x.
RECORDED = {
    "utilization (queued steps)": {"reserve_max": "~28%", "paged16": "96-98%"},
    "paged waste = reserved + internal": {"paged16": "~1%"},
    "mean running batch (queued steps)": {"reserve_max": "32", "paged16": "134"},
    "throughput vs reserve_max": {"paged16": "~2.2x"},
}


def policies(sc: Scenario, block_size: int = 16, impl: str = "vllm_style") -> list:
    return [reserve_max(sc.budget, sc.max_output), oracle(sc.budget), Paged(sc.budget, block_size, impl=impl),
            Paged(sc.budget, block_size, impl=impl, swap=True, cpu_budget=sc.budget // 4)]


def run_scenario(name: str, *, progress: bool = False, impl: str = "vllm_style") -> list[Metrics]:
    sc = SCENARIOS[name]
    requests = sc.requests()
    return [simulate(requests, p, progress=progress) for p in policies(sc, impl=impl)]


def rows(results: list[Metrics]) -> list[tuple[str, list[str]]]:
    base = results[0]
    pct = lambda x: f"{100 * x:.1f}%"
    return [
        ("utilization (queued steps)", [pct(m.share("stored")) for m in results]),
        ("utilization (all steps)", [pct(m.share("stored", "overall")) for m in results]),
        ("reserved-but-unused (queued)", [pct(m.share("reserved_unused")) for m in results]),
        ("internal fragmentation (queued)", [pct(m.share("internal")) for m in results]),
        ("external fragmentation (queued)", [pct(m.share("external")) for m in results]),
        ("paged waste = reserved + internal", [pct(m.share("reserved_unused") + m.share("internal")) for m in results]),
        ("mean running batch (queued steps)", [f"{m.mean('batch'):.1f}" for m in results]),
        ("mean running batch (all steps)", [f"{m.mean('batch', 'overall'):.1f}" for m in results]),
        ("total steps", [str(m.steps) for m in results]),
        ("preemptions (of which swaps)", [f"{m.preemptions} ({m.swaps})" for m in results]),
        ("recomputed tokens", [str(m.recomputed_tokens) for m in results]),
        ("throughput, tokens/step", [f"{m.throughput:.1f}" for m in results]),
        ("throughput vs reserve_max", [f"{m.throughput / base.throughput:.2f}x" for m in results]),
    ]


def table(name: str, results: list[Metrics]) -> str:
    sc = SCENARIOS[name]
    names = [m.policy for m in results]
    head = [f"scenario ({name}): {sc.n_requests} requests, budget {sc.budget:,} tokens, outputs capped at "
            f"{sc.max_output}; averages over steps with requests queued / over all steps",
            f"{'metric':<36}" + "".join(f"{n:>14}" for n in names) + "   recorded"]
    lines = []
    for label, cells in rows(results):
        seeds = ", ".join(f"{k} {v}" for k, v in RECORDED.get(label, {}).items())
        lines.append(f"{label:<36}" + "".join(f"{c:>14}" for c in cells) + (f"   {seeds}" if seeds else ""))
    return "\n".join(head + lines)


def block_size_sweep(name: str = "a", sizes=(1, 16, 256), impl: str = "vllm_style") -> list[tuple[int, float]]:
    """(block size, allocated-but-unused slots per running request, averaged over all steps)."""
    sc = SCENARIOS[name]
    requests = sc.requests()
    out = []
    for bs in sizes:
        m = simulate(requests, Paged(sc.budget, bs, impl=impl))
        out.append((bs, (m.overall.reserved_unused + m.overall.internal) / m.overall.batch))
    return out
