"""The report's sections, in the order they appear."""

from __future__ import annotations

import re

import torch

from llm_inference_harness.bench.report.document import Report, section
from llm_inference_harness.engine import inputs

MARKS = {"pass": "pass", "FAIL": "**FAIL**", "skip": "skip", "upstream": "upstream", "stale": "**stale**"}


def _verdicts(name: str) -> tuple[list[dict], str]:
    """(verdicts that `harness run` saved for this machine, where they came from); computed now (ci
    profile) when absent."""
    from llm_inference_harness.contracts import load_techniques
    from llm_inference_harness.engine import provenance, runner
    from llm_inference_harness.engine.registry import impls

    path = provenance.output_root() / "verdicts" / f"{name}.json"
    if path.is_file():
        document = inputs.verdicts(path)
        source = f"{document['machine']['name']} at commit {document['commit']} (`harness run`)"
        if name == "mutants":
            return [v for t in document["techniques"] for v in t["verdicts"]], source
        return document["verdicts"], source
    here = f"{provenance.machine_name()} at commit {provenance.commit()}"
    if name == "mutants":
        results = [r for t in sorted(load_techniques()) for r in runner.kill_mutants(t, profile="ci")]
    else:
        results = runner.check(name, [runner.Target(name, name=i.name) for i in impls(name)], profile="ci")
    return [v.as_dict() for r in results for v in r.verdicts], here


@section("Conformance: implementation x property")
def conformance(r: Report) -> None:
    from llm_inference_harness.contracts import load_techniques

    r.caption("Every registered implementation against every property of its technique (ci profile): "
              "a FAIL here is a bug; skips carry the capability the implementation does not declare.")
    for t in sorted(load_techniques()):
        verdicts, source = _verdicts(t)
        props = list(dict.fromkeys(v["property"] for v in verdicts))
        impls = list(dict.fromkeys(v["impl"] for v in verdicts))
        cell = {(v["impl"], v["property"]): MARKS[v["status"]] for v in verdicts}
        r.heading(t, level=3)
        r.table(["implementation", *props], [[i, *(cell.get((i, p), "") for p in props)] for i in impls],
                source=source)
    mutants, source = _verdicts("mutants")
    from llm_inference_harness.engine.registry import impls as registered

    r.heading("Mutant kill matrix", level=3)
    r.caption("Each known-wrong implementation (a real bug) and the properties that caught it, the declared killer "
              "in bold.  A mutant's run stops at its first kill for its reason; `harness mutants "
              "--all-properties` runs every property against every mutant.")
    rows = []
    for t in sorted(load_techniques()):
        for m in registered(t, mutants=True):
            mine = [v for v in mutants if v["impl"] == m.name]
            killers = [v["property"] for v in mine if v["status"] == "FAIL"]
            declared = [k for k in killers if k in m.killed_by]
            rows.append([t, m.name, m.bug, ", ".join(f"**{k}**" if k in declared else k for k in killers)
                         or "SURVIVED"])
    r.table(["technique", "mutant", "bug", "killed by"], rows, source=source)


def _maybe(values, benchmark: str) -> dict:
    """values(benchmark), or {} where this machine has no result of it."""
    try:
        return values(benchmark)
    except NotImplementedError:
        return {}


def _family(name: str) -> str:
    """An implementation's family: its name without the tile size ("fa2_lazy_rescale_128x256" -> "fa2_lazy_rescale")."""
    return re.sub(r"_\d+(x\d+)?$", "", name)


STYLE_MARKERS = "osD^vP*X"


def _styles(names: list[str]) -> dict[str, dict]:
    """One colour and one marker per series, the same in every panel of a figure."""
    return {n: {"color": f"C{i % 10}", "marker": STYLE_MARKERS[i % len(STYLE_MARKERS)]} for i, n in enumerate(names)}


def _legend_below(ax, ncol: int = 2) -> None:
    """The legend under the panel, off the data."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol, frameon=False)


def _plain_log_ticks(ax, axis: str = "y") -> None:
    """Log-axis ticks as plain numbers (1, 2, 3, 5, 10 ...), not 2 x 10^0."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    fmt = FuncFormatter(lambda x, _: f"{x:g}")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))  # a narrow range still gets 2-3 labels
    target.set_major_formatter(fmt)
    target.set_minor_formatter(FuncFormatter(lambda x, _: ""))


def forward_ratios(times, device: str = "cpu") -> dict[str, dict[int, float]]:
    """{implementation: {N: causal forward time / SDPA's}} from asv's AttentionForward.time_forward, each ratio
    of two cases measured in the same run (the same commit's result file) only."""
    ratios: dict[str, dict[int, float]] = {}
    for (impl, dev, shape, causal), t in times.items():
        sdpa = ("sdpa", dev, shape, causal)
        if dev != device or not causal or impl == "sdpa" or sdpa not in times:
            continue
        if times.sources[sdpa].commit == times.sources[impl, dev, shape, causal].commit:
            ratios.setdefault(impl, {})[int(shape.split("x")[2])] = t / times[sdpa]
    return ratios


def ratio_figure(ratios: dict[str, dict[int, float]], panels: list[tuple[str, list[str]]]):
    """One panel per group of at most MAX_SERIES implementations: time / SDPA's vs N."""
    import matplotlib.pyplot as plt

    styles = _styles([name for _, names in panels for name in names])
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5.4), sharey=True, squeeze=False)
    for ax, (title, names) in zip(axes[0], panels, strict=True):
        for name in names:
            Ns = sorted(ratios[name])
            ax.plot(Ns, [ratios[name][N] for N in Ns], "-", label=name, lw=1.2, ms=5, **styles[name])
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_log_ticks(ax)
        Ns = sorted({N for name in names for N in ratios[name]})
        ax.set_xticks(Ns, [str(N) for N in Ns])
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("forward time / SDPA's time (dashed: SDPA)")
        ax.set_title(title, fontsize=10)
        _legend_below(ax)
    fig.suptitle("Attention forward against SDPA (asv AttentionForward.time_forward): B=1, H=8, d=64, causal, "
                 "float32, CPU", fontsize=10)
    return fig


def _groups(names: list[str], title: str) -> list[tuple[str, list[str]]]:
    from llm_inference_harness.bench.report.document import MAX_SERIES

    chunks = [names[i:i + MAX_SERIES] for i in range(0, len(names), MAX_SERIES)]
    return [(f"{title} ({k + 1}/{len(chunks)})" if len(chunks) > 1 else title, chunk) for k, chunk in enumerate(chunks)]


@section("Attention: forward time vs N")
def attention_time(r: Report) -> None:
    from llm_inference_harness.bench.report.asvdata import values

    times = values("bench_attention.AttentionForward.time_forward")
    ratios = forward_ratios(times)
    if not ratios:
        raise NotImplementedError("no CPU AttentionForward run with SDPA and another implementation in one run")
    at = max(N for rs in ratios.values() for N in rs)
    best: dict[str, str] = {}  # family -> its fastest variant at the largest N measured
    for name in sorted((n for n in ratios if at in ratios[n]), key=lambda n: ratios[n][at]):
        best.setdefault(_family(name), name)
    shown = sorted(best.values(), key=lambda n: ratios[n][at])
    tiled = [n for n in shown if n.startswith(("fa1", "fa2"))]
    others = [n for n in shown if n not in tiled]
    fig = ratio_figure(ratios, _groups(tiled, "tiled kernels (FlashAttention-1/2 families)")
                       + _groups(others, "the others"))
    keys = [k for k in times if k[0] in shown or k[0] == "sdpa"]
    r.figure(fig, "attention_time", f"Forward time over SDPA's vs sequence length: the fastest variant (at N={at}) "
                                    "of each kernel family; each ratio is of two cases of one asv run (a ratio below "
                                    "1 beats SDPA).", times.where(keys))
    Ns = sorted({N for name in shown for N in ratios[name]})
    r.table(["implementation", *(f"N={N}" for N in Ns)],
            [[name, *(ratios[name].get(N, "n/a") for N in Ns)] for name in shown],
            caption="The figure's numbers: causal forward time / SDPA's.", source=times.where(keys))
    try:
        ratios_asv = values("bench_attention.SdpaRatio.track_best_tiled_over_sdpa")
    except NotImplementedError as exc:
        r.text(f"`SdpaRatio`: {exc}")
        return
    fastest = _maybe(values, "bench_attention.SdpaRatio.track_fastest_calls_tiled_over_sdpa")
    r.table(["device", "CPU threads", "best tiled / SDPA (median of rounds: the goal)", "fastest calls"],
            [[*key, v, fastest.get(key, "n/a")] for key, v in sorted(ratios_asv.items())],
            caption="asv `SdpaRatio` (B=1, H=8, N=2048, d=64, causal, float32): the three fastest tiled "
                    "kernels and SDPA take turns for 15 rounds.  The goal (<= 1.0) is the median over rounds "
                    "of the best ratio; the fastest-calls column sets the best tiled kernel's fastest call "
                    "against SDPA's (timeit's reading: what each costs when nothing else runs).",
            source=ratios_asv.where())
    try:
        flex = values("bench_attention.FlexCompiled.track_flex_compiled_over_sdpa")
    except NotImplementedError as exc:
        r.text(f"`FlexCompiled`: {exc}")
        return
    r.table(["device", "torch.compile(flex_attention) / SDPA"], [[*key, v] for key, v in sorted(flex.items())],
            caption="asv `FlexCompiled`, same shape: the fused FlexAttention kernel that `flex` (eager, the "
                    "unfused reference path) stands for in the property suite.", source=flex.where())


@section("Attention on the GPU: the Triton kernels against SDPA")
def attention_gpu(r: Report) -> None:
    """This machine's KernelTflops; on a machine without them, the committed GPU machines', labelled as such."""
    from llm_inference_harness.bench.report.asvdata import machines
    from llm_inference_harness.engine import provenance

    here = provenance.machine_name()
    if _maybe_on("bench_attention.KernelTflops.track_tflops", here):
        _kernel_tflops(r, here)
        return
    shown = [m for m in machines() if m != here and _maybe_on("bench_attention.KernelTflops.track_tflops", m)]
    if not shown:
        raise NotImplementedError("no KernelTflops results here (they need a CUDA device) nor in results/")
    for machine in shown:
        r.heading(f"Committed results of {machine} (another machine, not this one), for comparison", level=3)
        _kernel_tflops(r, machine)


def _maybe_on(benchmark: str, machine: str) -> dict:
    from llm_inference_harness.bench.report.asvdata import values

    try:
        return values(benchmark, machine)
    except NotImplementedError:
        return {}


def _kernel_tflops(r: Report, machine: str) -> None:
    from llm_inference_harness.bench.report.asvdata import values

    for way in ("forward", "backward"):
        bench = "bench_attention" if way == "forward" else "bench_attention_backward"
        tflops = values(f"{bench}.KernelTflops.track_tflops", machine)
        pairs = {case: (tflops["triton_fa2", *case], tflops["sdpa", *case])
                 for case in sorted({key[1:] for key in tflops})
                 if ("triton_fa2", *case) in tflops and ("sdpa", *case) in tflops}  # case: (device, N, d, causal)
        r.table(["N", "d", "causal", "Triton TFLOP/s", "SDPA TFLOP/s", "Triton / SDPA"],
                [[N, d, causal, triton, sdpa, triton / sdpa] for (_, N, d, causal), (triton, sdpa) in pairs.items()],
                source=tflops.where(),
                caption=f"asv `{bench}.KernelTflops`: {way} TFLOP/s in bfloat16 at the FlashAttention-2 paper's "
                        "shapes (batch x N = 16k tokens, H x d = 2048; the backward counted as 2.5 forwards), "
                        "median of 10 calls timed with CUDA events.  The "
                        "Triton kernels run one 64 x 64 tile with Triton's default warps and stages, untuned.")


@section("Attention: modelled HBM traffic and the SRAM sweep")
def attention_io(r: Report) -> None:
    import matplotlib.pyplot as plt

    from llm_inference_harness.analytic import iomodel

    d, Br = 64, 128
    Ns = [256, 512, 1024, 2048, 4096, 8192]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.loglog(Ns, [iomodel.standard_traffic(N, N, d) for N in Ns], "o-", label="standard: 4N^2 + 4Nd")
    a.loglog(Ns, [iomodel.fa2_traffic(N, N, d, Br) for N in Ns], "s--", label=f"FA-2, Br={Br}")
    M = 100_000  # elements of SRAM (~ 200 KB of fp16)
    a.loglog(Ns, [iomodel.fa1_traffic(N, N, d, iomodel.fa1_paper_blocks(M, d)[1]) for N in Ns], "D:",
             label=f"FA-1, M={M:,}")
    a.set_xticks(Ns, [str(N) for N in Ns])
    a.minorticks_off()
    a.set_xlabel(f"sequence length N (d={d})")
    a.set_ylabel("HBM elements read + written")
    a.legend(fontsize=8)
    Ms = [2**k for k in range(12, 21)]
    for dd, fmt in ((64, "o-"), (128, "s--")):
        b.semilogx(Ms, [iomodel.savings(4096, dd, M=m) for m in Ms], fmt, label=f"FA-1 savings, d={dd}")
        b.axvline(3 * dd * dd, ls=":", color="gray")
    b.axhline(1.0, color="black", lw=0.8)
    b.set_xlabel("SRAM capacity M (elements); dotted: 3 d^2")
    b.set_ylabel("standard / flash traffic (N=4096)")
    b.legend(fontsize=8)
    r.figure(fig, "attention_io", "Left: flash traffic grows like N^2 d / Br instead of N^2; right: FA-1 beats "
                                  "standard attention only once M exceeds 3 d^2 (dotted), then saves ~M / 3d^2.  "
                                  "Computed by the IO model (harness/analytic/iomodel.py), not measured.", r.here)
    std, fa2 = iomodel.standard_traffic(4096, 4096, 128), iomodel.fa2_traffic(4096, 4096, 128, 128)
    r.table(["N", "d", "Br", "standard", "FA-2", "ratio"], [[4096, 128, 128, f"{std:,}", f"{fa2:,}", std / fa2]],
            caption="A worked exercise, computed by the closed forms the IO twins are tested against "
                    "(by hand: 69,206,016 vs 34,607,104 elements, 2.0x).")


@section("Attention: forward and backward memory",
         sweep="peak memory of every implementation at 4 lengths: ~40 s on 2 cores")
def attention_memory(r: Report) -> None:
    from llm_inference_harness.engine.memory import TensorMemory
    from llm_inference_harness.engine.progress import progress
    from llm_inference_harness.engine.registry import get
    from llm_inference_harness.references.attention import attention_lse64

    forward = get("attention", "naive").fn, get("attention", "fa2_64x64").fn
    backward = get("attention_backward", "naive").fn, get("attention_backward", "fa2_64x64").fn
    rows = []
    g = torch.Generator().manual_seed(0)
    for N in progress([256, 512, 1024, 2048], desc="attention memory", unit="N"):
        q, k, v, do = (torch.randn(1, 8, N, 64, generator=g) for _ in range(4))
        o, lse = (t.float() for t in attention_lse64(q, k, v, causal=True))
        peaks = []
        for fn, args in [(f, (q, k, v)) for f in forward] + [(f, (q, k, v, o, lse, do)) for f in backward]:
            with TensorMemory() as meter:
                fn(*args, causal=True)
            peaks.append(meter.peak / 2**20)
        rows.append([N, *peaks])
    r.table(["N", "naive forward (MiB)", "FA-2 forward (MiB)", "naive backward (MiB)", "FA-2 backward (MiB)"], rows,
            caption="Peak live tensor bytes (B=1, H=8, d=64, causal, fp32): the naive kernels hold N x N matrices "
                    "and grow quadratically; the FA-2 ones work block by block and grow linearly.")


def _series(values: dict[tuple, float], x: int, cpu_at: int | None = None) -> dict[str, tuple[list, list, list]]:
    """Group asv values by their first parameter: {name: (xs, ys, keys)} with x the parameter at index ``x``."""
    out: dict[str, tuple[list, list, list]] = {}
    for key, val in sorted(values.items(), key=lambda kv: (kv[0][0], kv[0][x])):
        if cpu_at is None or key[cpu_at] == "cpu":
            xs, ys, keys = out.setdefault(key[0], ([], [], []))
            xs.append(key[x])
            ys.append(val)
            keys.append(key)
    return out


def _points(ax, values, xs, ys, keys, fmt: str = "-", **style) -> None:
    """A series with its interquartile range as error bars where asv recorded one (several samples)."""
    spread = [values.spread.get(k) for k in keys]
    yerr = None
    if any(spread):
        yerr = [[y - (q or (y, y))[0] for y, q in zip(ys, spread, strict=True)],
                [(q or (y, y))[1] - y for y, q in zip(ys, spread, strict=True)]]
    ax.errorbar(xs, ys, yerr=yerr, fmt=fmt, capsize=3, ms=5, lw=1.2, **style)


def _spread_note(*values) -> str:
    if any(v.spread for v in values):
        return "Bars: interquartile range of asv's samples."
    return "One asv sample per point (asv --quick): no spread recorded to draw."


@section("KV cache: cached vs recompute, decode vs batch, prefill vs decode")
def kv_cache(r: Report) -> None:
    import matplotlib.pyplot as plt

    from llm_inference_harness.bench.report.asvdata import values

    ratio = values("bench_kvcache.CachedVsRecompute.track_recompute_over_cached")
    step = values("bench_kvcache.DecodeBatch.track_us_per_token")
    impls = sorted({key[0] for key in ratio} | {key[0] for key in step})
    styles = _styles(impls)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.8))
    widths = sorted({key[3] for key in ratio})
    for ax, width in zip(axes, widths[:2], strict=False):
        for impl, (xs, ys, keys) in _series({k: v for k, v in ratio.items() if k[3] == width}, x=2, cpu_at=1).items():
            _points(ax, ratio, xs, ys, keys, label=impl, **styles[impl])
        ax.set_title(f"cached vs recompute, d={width}", fontsize=10)
        ax.set_xlabel("tokens generated n")
        ax.set_ylabel("recompute time / cached time")
        _legend_below(ax)
    b_ = axes[2]
    for impl, (xs, ys, keys) in _series(step, x=2, cpu_at=1).items():
        _points(b_, step, xs, ys, keys, label=impl, **styles[impl])
    b_.set_xscale("log")
    b_.set_yscale("log")
    _plain_log_ticks(b_, "x")
    _plain_log_ticks(b_)
    b_.set_title("decode step, cache length 64", fontsize=10)
    b_.set_xlabel("batch size")
    b_.set_ylabel("step time per token (us)")
    _legend_below(b_)
    r.figure(fig, "kv_cache", "Left and middle: a cache turns O(n^2) generation into O(n), so the speedup grows with n "
                              "(d=128 is the target's width, where a cached step is mostly per-op overhead; "
                              "d=256 the same 4 layers twice as wide); right: batching amortizes the weight "
                              f"reads until compute takes over.  {_spread_note(ratio, step)}",
             f"{ratio.where()} (cached vs recompute); {step.where()} (decode step)")
    longest = max(key[2] for key in ratio)
    r.table(["implementation", "width d", "n", "recompute / cached"],
            [[k[0], k[3], k[2], v] for k, v in sorted(ratio.items()) if k[1] == "cpu" and k[2] == longest],
            caption="Cached vs recompute generation at the largest n (goal >= 10x at n = 512).", source=ratio.where())
    prefill = values("bench_kvcache.PrefillVsDecode.track_decode_over_prefill")
    r.table(["implementation", "decode 256 one by one / prefill 256"],
            [[key[0], val] for key, val in sorted(prefill.items()) if key[1] == "cpu"],
            caption="Per-token cost of decoding vs prefilling the same 256 tokens (~27x when this benchmark was "
                    "written).", source=prefill.where())
    roof = values("bench_kvcache.MemoryRoofline.track_fraction_of_matvec_bandwidth")
    r.table(["implementation", "weight bytes per step / step time, fraction of matvec bandwidth"],
            [[key[0], val] for key, val in sorted(roof.items()) if key[1] == "cpu"],
            caption="Batch-1 decode of a >= 100M-parameter random model against the memory roofline (goal >= 0.85).",
            source=roof.where())


@section("Paging: serving policies and block size")
def paging(r: Report) -> None:
    from llm_inference_harness.analytic.simulator import report as sim

    for name in ("a", "b"):
        results = sim.run_scenario(name, progress=True)
        header = ["metric", *(m.policy for m in results)]
        r.table(header, [[label, *cells] for label, cells in sim.rows(results)],
                caption=f"Scenario ({name}): paging lifts utilization and the running batch (recorded when the "
                        "scenarios were written: reserve-max ~28%, paged ~96-98%, batch 32 -> 134, ~2.2x throughput).")
    sweep = sim.block_size_sweep("a")
    r.table(["block size", "wasted tokens per request", "(block - 1) / 2"], [[b, w, (b - 1) / 2] for b, w in sweep],
            caption="Internal fragmentation per request is half a block on average.")
    from llm_inference_harness.bench.report.asvdata import values

    ratio = values("bench_paging.PagedDecodeAttention.track_paged_over_contiguous")
    lengths = sorted({key[2] for key in ratio})
    r.table(["implementation", *(f"cache {n}" for n in lengths)],
            [[impl, *(ratio.get((impl, "cpu", n), float("nan")) for n in lengths)]
             for impl in sorted({key[0] for key in ratio})],
            caption="Paged decode attention time / SDPA on the same contiguous K/V (B=8, H=32, Hkv=8, d=128, "
                    "block 16, float32, CPU; goal <= 1.25).", source=ratio.where())


@section("Quantization: NLL vs bits per granularity, and the outlier table",
         sweep="the tiny target's test NLL under 40 quantizations: ~3.5 min on 2 cores")
def quantization(r: Report) -> None:
    from llm_inference_harness.analytic import quant_experiments as qe

    tables = qe.tables(n_docs=100)
    r.table(["bits", *tables["granularities"]], tables["nll"],
            caption=f"Test NLL (nats/token) of the weight-quantized target; unquantized {tables['base']:.4f}, "
                    f"good draft {tables['draft']:.4f}: 8 and 4 bits are nearly free, 2-bit per tensor collapses, "
                    "smaller groups rescue it.")
    r.table(["scheme", "original", "outlier injected"], tables["outliers"],
            caption="A function-preserving outlier channel (x100 in a LayerNorm, /100 in the next Linear) breaks "
                    "per-tensor activation quantization at low bits; LLM.int8() and SmoothQuant recover.")


@section("Speculative decoding: tokens per target call and speedup")
def speculative(r: Report) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from llm_inference_harness.bench.report.asvdata import values

    measured = values("bench_speculative.Acceptance.track_tokens_per_call_measured")
    formula = values("bench_speculative.Acceptance.track_tokens_per_call_formula")
    speed = values("bench_speculative.WallClock.track_speedup_measured")
    estimated = _series(values("bench_speculative.WallClock.track_speedup_estimated"), x=1, cpu_at=2)
    with_verify = _series(values("bench_speculative.WallClock.track_speedup_estimated_with_verify"), x=1, cpu_at=2)
    styles = _styles(sorted({k[0] for k in measured} | {k[0] for k in speed}))
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 5.2))
    theory = _series(formula, x=1)
    for draft, (xs, ys, keys) in _series(measured, x=1).items():
        _points(a, measured, xs, ys, keys, fmt="", ls="none", label=draft, **styles[draft])
        a.plot(*theory[draft][:2], "-", color=styles[draft]["color"], lw=0.8)
    a.set_xlabel("gamma (drafted tokens per round)")
    a.set_ylabel("tokens per target call")
    a.set_title("markers: measured; lines: (1 - a^(g+1)) / (1 - a)", fontsize=10)
    _legend_below(a, ncol=3)
    for draft, (xs, ys, keys) in _series(speed, x=1, cpu_at=2).items():
        _points(b, speed, xs, ys, keys, fmt="", ls="none", label=draft, **styles[draft])
        b.plot(*estimated[draft][:2], "--", color=styles[draft]["color"], lw=0.8)
        if draft in with_verify:
            b.plot(*with_verify[draft][:2], ":", color=styles[draft]["color"], lw=1.2)
    b.axhline(1.0, color="black", lw=0.8)
    b.set_xlabel("gamma (drafted tokens per round)")
    b.set_ylabel("speedup over plain sampling")
    b.set_title("markers: measured; dashed / dotted: estimates", fontsize=10)
    handles, labels = b.get_legend_handles_labels()
    handles += [Line2D([], [], color="0.3", ls="--", lw=0.8), Line2D([], [], color="0.3", ls=":", lw=1.2)]
    labels += ["estimate, verify = 1 step", "estimate, measured verify cost"]
    b.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    r.figure(fig, "speculative", "Left: measured tokens per target call follow the formula for every draft; "
                                 "right: wall-clock speedup on this CPU (markers) vs (1-a^(g+1))/((1-a)(1+g c)) "
                                 "(dashed) and vs (1-a^(g+1))/((1-a)(v+g c)) with v the measured cost of the "
                                 "(g+1)-position verify call in one-token steps (dotted).  "
                                 + _spread_note(measured, speed),
             f"{measured.where()} (acceptance); {speed.where()} (wall clock)")
    _time_per_token(r, values("bench_speculative.TimePerToken.track_microseconds_per_token"))


def _time_per_token(r: Report, us: dict[tuple, float]) -> None:
    """Table of asv TimePerToken: (gamma, part) -> microseconds per token, gamma 0 being plain sampling."""
    parts = ("target", "draft", "sampler")
    gammas = sorted({g for g, _ in us if all((g, p) in us for p in parts)})
    if 0 not in gammas:
        raise NotImplementedError("TimePerToken has no complete plain-sampling row yet")
    plain = sum(us[0, p] for p in parts)
    rows = [["plain" if g == 0 else g, *(us[g, p] for p in parts), sum(us[g, p] for p in parts),
             plain / sum(us[g, p] for p in parts), "" if g == 0 else plain / us[g, "target"]] for g in gammas]
    r.table(["gamma", "target us/token", "draft us/token", "sampler us/token", "total", "speedup",
             "speedup if draft and sampler were free"], rows, source=us.where(),
            caption="asv `TimePerToken`, draft_good: where a generated token's time goes (the target's and the "
                    "draft's sessions, and the sampler's own work).  Each gamma is a separate asv case, so its "
                    "speedup is noisier than WallClock's, whose two samplers take turns (the goal, >= 2x, is read "
                    "from WallClock: the figure's dots).  The last column is the ceiling the target's part "
                    "allows: plain time per token / the target's time per token.")


HEADLINE_TABLE = [  # (benchmark, what it says) of the comparison section
    ("bench_attention.SdpaRatio.track_best_tiled_over_sdpa", "best tiled attention / SDPA (<= 1.0)"),
    ("bench_attention.KernelTflops.track_tflops", "attention forward TFLOP/s"),
    ("bench_kvcache.CachedVsRecompute.track_recompute_over_cached", "recompute / cached generation (>= 10x at 512)"),
    ("bench_kvcache.MemoryRoofline.track_fraction_of_matvec_bandwidth", "decode / matvec bandwidth (>= 0.85)"),
    ("bench_paging.PagedDecodeAttention.track_paged_over_contiguous", "paged / contiguous decode attention (<= 1.25)"),
    ("bench_speculative.Enumeration.time_vocab4_gamma3_T4", "exact enumeration, vocabulary 4 (s, <= 1)"),
]


@section("Other machines: committed results, for comparison")
def other_machines(r: Report) -> None:
    """Not this machine's numbers: the headline benchmarks as other machines' committed runs measured them."""
    from llm_inference_harness.bench.report.asvdata import machines, values
    from llm_inference_harness.engine import provenance

    others = [m for m in machines() if m != provenance.machine_name()]
    if not others:
        raise NotImplementedError("no committed results of another machine")
    r.caption("Everything above was measured on this machine.  These rows are not: they are committed asv results "
              "of other machines (results/<machine>/), each with the machine and commit it came from, to compare "
              "against.")
    rows = []
    for bench, meaning in HEADLINE_TABLE:
        for machine in others:
            try:
                got = values(bench, machine)
            except NotImplementedError:
                continue
            for key, value in sorted(got.items(), key=str):
                rows.append([meaning, machine, ", ".join(map(str, key)), value, got.sources[key].commit[:8]])
    r.table(["benchmark", "machine", "case", "value", "commit"], rows,
            caption="Other machines' committed results (not measured here).",
            source="the machines and commits in the table")
