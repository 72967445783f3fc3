"""The report's sections, in the order they appear."""

from __future__ import annotations

import json

import torch

from harness.report.document import Report, section

MARKS = {"pass": "pass", "FAIL": "**FAIL**", "skip": "skip", "upstream": "upstream", "stale": "**stale**"}


def _verdicts(name: str) -> list[dict]:
    """Verdicts that `python -m harness run` saved for this machine; computed now (ci profile) when absent."""
    from harness import provenance, runner
    from harness.contracts import load_techniques
    from harness.registry import impls

    path = provenance.output_root() / "verdicts" / f"{name}.json"
    if path.is_file():
        document = json.loads(path.read_text())
        if name == "mutants":
            return [v for t in document["techniques"] for v in t["verdicts"]]
        return document["verdicts"]
    if name == "mutants":
        results = [r for t in sorted(load_techniques()) for r in runner.kill_mutants(t, profile="ci")]
    else:
        results = runner.check(name, [runner.Target(name, name=i.name) for i in impls(name)], profile="ci")
    return [v.as_dict() for r in results for v in r.verdicts]


@section("Conformance: implementation x property")
def conformance(r: Report) -> None:
    from harness.contracts import load_techniques

    r.caption("Every registered implementation against every property of its technique (ci profile): "
              "a FAIL here is a bug; skips carry the capability the implementation does not declare.")
    for t in sorted(load_techniques()):
        verdicts = _verdicts(t)
        props = list(dict.fromkeys(v["property"] for v in verdicts))
        impls = list(dict.fromkeys(v["impl"] for v in verdicts))
        cell = {(v["impl"], v["property"]): MARKS[v["status"]] for v in verdicts}
        r.heading(t, level=3)
        r.table(["implementation", *props], [[i, *(cell.get((i, p), "") for p in props)] for i in impls])
    mutants = _verdicts("mutants")
    from harness.registry import impls as registered

    r.heading("Mutant kill matrix", level=3)
    r.caption("Each known-wrong implementation (a real bug) against the properties: 'killed' marks the "
              "properties that caught it; the declared killer is in bold.")
    rows = []
    for t in sorted(load_techniques()):
        for m in registered(t, mutants=True):
            mine = [v for v in mutants if v["impl"] == m.name]
            killers = [v["property"] for v in mine if v["status"] == "FAIL"]
            declared = [k for k in killers if k in m.killed_by]
            rows.append([t, m.name, m.bug, ", ".join(f"**{k}**" if k in declared else k for k in killers)
                         or "SURVIVED"])
    r.table(["technique", "mutant", "bug", "killed by"], rows)


@section("Attention: forward time vs N")
def attention_time(r: Report) -> None:
    import matplotlib.pyplot as plt
    import torch.utils.benchmark as tb

    from harness.progress import progress
    from harness.registry import impls

    names = [i for i in impls("attention") if i.name != "reference" and "cpu" in i.devices and "float32" in i.dtypes]
    Ns = [256, 512, 1024, 2048]
    times: dict[str, list[float]] = {}
    g = torch.Generator().manual_seed(0)
    for N in progress(Ns, desc="attention forward", unit="N"):
        q, k, v = (torch.randn(1, 8, N, 64, generator=g) for _ in range(3))
        for impl in names:
            timer = tb.Timer("f(q, k, v, causal=True)", globals={"f": impl.fn, "q": q, "k": k, "v": v})
            times.setdefault(impl.name, []).append(timer.blocked_autorange(min_run_time=0.2).median)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, ts in times.items():
        ax.loglog(Ns, [t * 1e3 for t in ts], marker="o", label=name)
    ax.set_xlabel("N (B=1, H=8, d=64, causal, float32, CPU)")
    ax.set_ylabel("forward time (ms)")
    ax.legend(fontsize=7, ncol=2)
    r.figure(fig, "attention_time", "Forward time vs sequence length: tiled kernels scale like N^2 like the "
                                    "naive one, but never materialize the N x N matrix; SDPA is the bar.")
    r.table(["implementation", "time at N=2048 (ms)"],
            sorted([[n, ts[-1] * 1e3] for n, ts in times.items()], key=lambda row: row[1]),
            caption="Measured in one pass, one implementation after another (for the figure): load that comes "
                    "and goes on a shared machine moves one implementation's time here by 10-20% against "
                    "another's, so no ratio is read off this table.  The ratio to SDPA is `SdpaRatio`'s, below, "
                    "where the candidates and SDPA take turns.")
    from harness.report.asvdata import values

    ratios = values("bench_attention.SdpaRatio.track_best_tiled_over_sdpa")
    fastest = values("bench_attention.SdpaRatio.track_fastest_calls_tiled_over_sdpa")
    r.table(["device", "CPU threads", "best tiled / SDPA (median of rounds: the goal)", "fastest calls"],
            [[*key, v, fastest.get(key, "n/a")] for key, v in sorted(ratios.items())],
            caption="asv `SdpaRatio` (B=1, H=8, N=2048, d=64, causal, float32): the three fastest tiled "
                    "kernels and SDPA take turns for 15 rounds.  The goal (<= 1.0) is the median over rounds "
                    "of the best ratio; the fastest-calls column sets the best tiled kernel's fastest call "
                    "against SDPA's (timeit's reading: what each costs when nothing else runs).")
    flex = values("bench_attention.FlexCompiled.track_flex_compiled_over_sdpa")
    r.table(["device", "torch.compile(flex_attention) / SDPA"], [[*key, v] for key, v in sorted(flex.items())],
            caption="asv `FlexCompiled`, same shape: the fused FlexAttention kernel that `flex` (eager, the "
                    "unfused reference path) stands for in the property suite.")


@section("Attention on the GPU: the Triton kernels against SDPA")
def attention_gpu(r: Report) -> None:
    from harness.report.asvdata import values

    for way in ("forward", "backward"):
        bench = "bench_attention" if way == "forward" else "bench_attention_backward"
        tflops = values(f"{bench}.KernelTflops.track_tflops")
        pairs = {case: (tflops["triton_fa2", *case], tflops["sdpa", *case])
                 for case in sorted({key[1:] for key in tflops})
                 if ("triton_fa2", *case) in tflops and ("sdpa", *case) in tflops}  # case: (device, N, d, causal)
        r.table(["N", "d", "causal", "Triton TFLOP/s", "SDPA TFLOP/s", "Triton / SDPA"],
                [[N, d, causal, triton, sdpa, triton / sdpa] for (_, N, d, causal), (triton, sdpa) in pairs.items()],
                caption=f"asv `{bench}.KernelTflops`: {way} TFLOP/s in bfloat16 at the FlashAttention-2 paper's "
                        "shapes (batch x N = 16k tokens, H x d = 2048; the backward counted as 2.5 forwards), "
                        "median of 10 calls timed with CUDA events, one run on the GPU machine in results/.  The "
                        "Triton kernels run one 64 x 64 tile with Triton's default warps and stages, untuned.")


@section("Attention: modelled HBM traffic and the SRAM sweep")
def attention_io(r: Report) -> None:
    import matplotlib.pyplot as plt

    from harness import iomodel

    d, Br = 64, 128
    Ns = [256, 512, 1024, 2048, 4096, 8192]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.loglog(Ns, [iomodel.standard_traffic(N, N, d) for N in Ns], "o-", label="standard: 4N^2 + 4Nd")
    a.loglog(Ns, [iomodel.fa2_traffic(N, N, d, Br) for N in Ns], "o-", label=f"FA-2, Br={Br}")
    M = 100_000  # elements of SRAM (~ 200 KB of fp16)
    a.loglog(Ns, [iomodel.fa1_traffic(N, N, d, iomodel.fa1_paper_blocks(M, d)[1]) for N in Ns], "o-",
             label=f"FA-1, M={M:,}")
    a.set_xlabel(f"N (d={d})")
    a.set_ylabel("HBM elements read + written")
    a.legend(fontsize=8)
    Ms = [2**k for k in range(12, 21)]
    for dd in (64, 128):
        b.semilogx(Ms, [iomodel.savings(4096, dd, M=m) for m in Ms], "o-", label=f"FA-1 savings, d={dd}")
        b.axvline(3 * dd * dd, ls=":", color="gray")
    b.axhline(1.0, color="black", lw=0.8)
    b.set_xlabel("SRAM capacity M (elements); dotted: 3 d^2")
    b.set_ylabel("standard / flash traffic (N=4096)")
    b.legend(fontsize=8)
    r.figure(fig, "attention_io", "Left: flash traffic grows like N^2 d / Br instead of N^2; right: FA-1 beats "
                                  "standard attention only once M exceeds 3 d^2 (dotted), then saves ~M / 3d^2.")
    std, fa2 = iomodel.standard_traffic(4096, 4096, 128), iomodel.fa2_traffic(4096, 4096, 128, 128)
    r.table(["N", "d", "Br", "standard", "FA-2", "ratio"], [[4096, 128, 128, f"{std:,}", f"{fa2:,}", std / fa2]],
            caption="A worked exercise, computed by the closed forms the IO twins are tested against "
                    "(by hand: 69,206,016 vs 34,607,104 elements, 2.0x).")


@section("Attention: forward and backward memory")
def attention_memory(r: Report) -> None:
    from harness.memory import TensorMemory
    from harness.progress import progress
    from harness.references.attention import attention_lse64
    from harness.registry import get

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


def _series(values: dict[tuple, float], x: int, cpu_at: int | None = None) -> dict[str, tuple[list, list]]:
    """Group asv values by their first parameter: {name: (xs, ys)} with x the parameter at index ``x``."""
    out: dict[str, tuple[list, list]] = {}
    for key, val in sorted(values.items(), key=lambda kv: (kv[0][0], kv[0][x])):
        if cpu_at is None or key[cpu_at] == "cpu":
            xs, ys = out.setdefault(key[0], ([], []))
            xs.append(key[x])
            ys.append(val)
    return out


@section("KV cache: cached vs recompute, decode vs batch, prefill vs decode")
def kv_cache(r: Report) -> None:
    import matplotlib.pyplot as plt

    from harness.report.asvdata import values

    ratio = values("bench_kvcache.CachedVsRecompute.track_recompute_over_cached")
    step = values("bench_kvcache.DecodeBatch.track_us_per_token")
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for width in sorted({key[3] for key in ratio}):
        for impl, (xs, ys) in _series({k: v for k, v in ratio.items() if k[3] == width}, x=2, cpu_at=1).items():
            a.plot(xs, ys, "o-" if width == 128 else "s--", label=f"{impl}, d={width}")
    a.set_xlabel("tokens generated n")
    a.set_ylabel("recompute time / cached time")
    a.legend(fontsize=8)
    for impl, (xs, ys) in _series(step, x=2, cpu_at=1).items():
        b.loglog(xs, ys, "o-", label=impl)
    b.set_xlabel("batch size (cache length 64)")
    b.set_ylabel("decode step time per token (us)")
    b.legend(fontsize=8)
    r.figure(fig, "kv_cache", "Left: a cache turns O(n^2) generation into O(n), so the speedup grows with n "
                              "(d=128 is the target's width, where a cached step is mostly per-op overhead; "
                              "d=256 the same 4 layers twice as wide); right: batching amortizes the weight "
                              "reads until compute takes over.")
    longest = max(key[2] for key in ratio)
    r.table(["implementation", "width d", "n", "recompute / cached"],
            [[k[0], k[3], k[2], v] for k, v in sorted(ratio.items()) if k[1] == "cpu" and k[2] == longest],
            caption="Cached vs recompute generation at the largest n (goal >= 10x at n = 512).")
    prefill = values("bench_kvcache.PrefillVsDecode.track_decode_over_prefill")
    r.table(["implementation", "decode 256 one by one / prefill 256"],
            [[key[0], val] for key, val in sorted(prefill.items()) if key[1] == "cpu"],
            caption="Per-token cost of decoding vs prefilling the same 256 tokens (~27x when this benchmark was "
                    "written).")
    roof = values("bench_kvcache.MemoryRoofline.track_fraction_of_matvec_bandwidth")
    r.table(["implementation", "weight bytes per step / step time, fraction of matvec bandwidth"],
            [[key[0], val] for key, val in sorted(roof.items()) if key[1] == "cpu"],
            caption="Batch-1 decode of a >= 100M-parameter random model against the memory roofline (goal >= 0.85).")


@section("Paging: serving policies and block size")
def paging(r: Report) -> None:
    from harness.simulator import report as sim

    for name in ("a", "b"):
        results = sim.run_scenario(name, progress=True)
        header = ["metric", *(m.policy for m in results)]
        r.table(header, [[label, *cells] for label, cells in sim.rows(results)],
                caption=f"Scenario ({name}): paging lifts utilization and the running batch (recorded when the "
                        "scenarios were written: reserve-max ~28%, paged ~96-98%, batch 32 -> 134, ~2.2x throughput).")
    sweep = sim.block_size_sweep("a")
    r.table(["block size", "wasted tokens per request", "(block - 1) / 2"], [[b, w, (b - 1) / 2] for b, w in sweep],
            caption="Internal fragmentation per request is half a block on average.")
    from harness.report.asvdata import values

    ratio = values("bench_paging.PagedDecodeAttention.track_paged_over_contiguous")
    lengths = sorted({key[2] for key in ratio})
    r.table(["implementation", *(f"cache {n}" for n in lengths)],
            [[impl, *(ratio.get((impl, "cpu", n), float("nan")) for n in lengths)]
             for impl in sorted({key[0] for key in ratio})],
            caption="Paged decode attention time / SDPA on the same contiguous K/V (B=8, H=32, Hkv=8, d=128, "
                    "block 16, float32, CPU; goal <= 1.25).")


@section("Quantization: NLL vs bits per granularity, and the outlier table")
def quantization(r: Report) -> None:
    from harness import quant_experiments as qe

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

    from harness.report.asvdata import values

    measured = values("bench_speculative.Acceptance.track_tokens_per_call_measured")
    formula = values("bench_speculative.Acceptance.track_tokens_per_call_formula")
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    theory = _series(formula, x=1)
    for i, (draft, (xs, ys)) in enumerate(_series(measured, x=1).items()):
        a.plot(xs, ys, "o", color=f"C{i}", label=draft)
        a.plot(*theory[draft], "-", color=f"C{i}", lw=0.8)
    a.set_xlabel("gamma")
    a.set_ylabel("tokens per target call (dots measured, lines (1-a^(g+1))/(1-a))")
    a.legend(fontsize=7)
    speed = values("bench_speculative.WallClock.track_speedup_measured")
    estimated = _series(values("bench_speculative.WallClock.track_speedup_estimated"), x=1, cpu_at=2)
    with_verify = _series(values("bench_speculative.WallClock.track_speedup_estimated_with_verify"), x=1, cpu_at=2)
    for i, (draft, (xs, ys)) in enumerate(_series(speed, x=1, cpu_at=2).items()):
        b.plot(xs, ys, "o", color=f"C{i}", label=draft)
        b.plot(*estimated[draft], "--", color=f"C{i}", lw=0.8)
        if draft in with_verify:
            b.plot(*with_verify[draft], ":", color=f"C{i}", lw=1.2)
    b.axhline(1.0, color="black", lw=0.8)
    b.set_xlabel("gamma")
    b.set_ylabel("speedup over plain sampling (dots measured)")
    b.legend(fontsize=7)
    r.figure(fig, "speculative", "Left: measured tokens per target call follow the formula for every draft; "
                                 "right: wall-clock speedup on this CPU (dots) vs (1-a^(g+1))/((1-a)(1+g c)) "
                                 "(dashed) and vs (1-a^(g+1))/((1-a)(v+g c)) with v the measured cost of the "
                                 "(g+1)-position verify call in one-token steps (dotted).")
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
             "speedup if draft and sampler were free"], rows,
            caption="asv `TimePerToken`, draft_good: where a generated token's time goes (the target's and the "
                    "draft's sessions, and the sampler's own work).  Each gamma is a separate asv case, so its "
                    "speedup is noisier than WallClock's, whose two samplers take turns (the goal, >= 2x, is read "
                    "from WallClock: the figure's dots).  The last column is the ceiling the target's part "
                    "allows: plain time per token / the target's time per token.")
