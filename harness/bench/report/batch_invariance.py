"""The report's batch-invariance section: for every registered implementation of the batched techniques, the
largest deviation measured between a row computed alone and the same row in other company (a batch, a
permuted batch, query chunks, a continuous-batching schedule), and between runs and thread counts; beside
it what the implementation declares, and the asv cost of the deliberately invariant implementations.
"""

from __future__ import annotations

from llm_inference_harness.bench.report.document import Report, section

BATCH = ("batch", "permutation", "chunks", "continuous")
RUNS = ("rerun", "threads")
KINDS = BATCH + RUNS


def cell(value: float | None) -> str:
    """'0' for the same bits, the deviation otherwise, blank where the kind does not apply."""
    if value is None:
        return ""
    return "0" if value == 0 else f"{value:.2g}"


def verdict(measured) -> str:
    """What the measurement says -- invariant in practice, or what a row's bits vary with -- set against what the
    implementation declares."""
    d = measured.deviation
    if not d:
        return measured.note or "not measured"
    said = []
    for kinds, same, cap in ((BATCH, "invariant in practice", "batch_invariant"),
                             (RUNS, "deterministic", "deterministic")):
        varies = [k for k in kinds if d.get(k, 0) > 0]
        if any(k in d for k in kinds):
            said.append(f"varies with {', '.join(varies)}" + (f" (**declares {cap}**)" if cap in measured.declared
                                                              else "") if varies else same)
    return "; ".join(said) + (f" ({measured.note})" if measured.note else "")


@section("Batch invariance and determinism",
         sweep="every batch-invariant implementation at several batch sizes and thread counts: ~1 min on 2 cores")
def batch_invariance(r: Report) -> None:
    from llm_inference_harness.engine.batch_invariance import TECHNIQUES, fixed_specs, measure_all

    r.caption("Largest |difference| between a row computed alone and the same row inside a batch of other rows "
              "(batch), in a permuted batch (permutation), with its queries in chunks (chunks: a chunked prefill "
              "or decode steps), or decoded under continuous batching with rows joining, leaving and re-prefilled "
              "(continuous); and between two runs (rerun) and 1 vs 2 intra-op threads (threads).  0 means the same "
              "bits (torch.equal): invariant in practice.  Implementations declaring `batch_invariant` / "
              "`deterministic` are checked bit for bit by the properties; the others are measured here.")
    for t in TECHNIQUES:
        measured = measure_all(t, jobs=2)
        kinds = [k for k in KINDS if any(k in m.deviation for m in measured)]
        r.heading(t, level=3)
        r.table(["implementation", "declares", "dtype", *kinds, "measured"],
                [[m.impl, ", ".join(m.declared) or "-", m.dtype, *(cell(m.deviation.get(k)) for k in kinds),
                  verdict(m)] for m in measured],
                caption=f"{len(fixed_specs(t, 'float32'))} fixed compositions (harness/engine/batch_invariance.py "
                        "`fixed_specs`), float32 where declared.")
    cost(r)


def cost(r: Report) -> None:
    from llm_inference_harness.bench.report.asvdata import values

    rows = []
    for bench in ("bench_attention", "bench_paging", "bench_kvcache", "bench_quantization", "bench_speculative"):
        try:
            found = values(f"{bench}.BatchInvarianceCost.track_batch_invariant_over_fastest")
        except NotImplementedError as exc:
            rows.append([bench, "n/a", str(exc)])
            continue
        rows += [[bench, *key, value] for key, value in sorted(found.items())]
    r.table(["benchmark", "device", "batch-invariant time / fastest non-invariant"], rows,
            caption="asv `BatchInvarianceCost`: the deliberately invariant implementation against the fastest one "
                    "that declares nothing, timed in turn in one run (median of the rounds' ratios).  On a CPU the "
                    "fixed order is one elementwise op per term instead of a BLAS call: the price of emulating a "
                    "fixed-tile, no-split-K kernel, not of invariance on a GPU.")
