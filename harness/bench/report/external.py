"""The report's section on third-party implementations: each adapted library's version, its verdict per
property, the upstream bugs recorded next to its adapters (with their reproductions), and its speed next to
ours as asv measured it on the same inputs.  Registers with `llm_inference_harness.bench.report.document.section`."""

from __future__ import annotations

import importlib.metadata

from llm_inference_harness.bench.report.document import Report, section

TECHNIQUES = ("attention", "quantization", "quantized_linear", "sampling", "speculative")
SOURCE = "llm_inference_harness.impls.external."
LIBRARY = {"gguf_quants": "gguf", "torchao_affine": "torchao", "torch_ao_observers": "torch",
           "bitsandbytes_int8": "bitsandbytes", "transformers_attention": "transformers",
           "transformers_speculative": "transformers", "flash_attn_kernels": "flash-attn",
           "flashinfer_kernels": "flashinfer-python", "xformers_kernels": "xformers", "vllm_ops": "vllm",
           "onnxruntime_ops": "onnxruntime", "quanto_weights": "optimum-quanto", "hqq_quant": "hqq",
           "compressed_tensors_int": "compressed-tensors", "mlx_affine": "mlx",
           "transformers_sampling": "transformers", "flashinfer_sampling": "flashinfer-python",
           "vllm_sampling": "vllm"}


def library_of(impl) -> str:
    return LIBRARY.get(impl.source.removeprefix(SOURCE), impl.source)


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@section("Third-party implementations")
def third_party(r: Report) -> None:
    from llm_inference_harness.bench.report.sections import MARKS
    from llm_inference_harness.engine.registry import KNOWN_FAILURES, impls

    r.caption("Libraries adapted to the contracts (impls/external/): each checked by the same properties as ours "
              "(ci profile), inside the formats it declares; 'upstream' marks a recorded bug of the library, "
              "with its reproduction below.")
    for t in TECHNIQUES:
        adapters = [i for i in impls(t) if i.source.startswith(SOURCE)]
        if not adapters:
            continue
        verdicts = adapter_verdicts(t, [a.name for a in adapters])
        props = list(dict.fromkeys(v["property"] for v in verdicts))
        cell = {(v["impl"], v["property"]): MARKS[v["status"]] for v in verdicts}
        r.heading(t, level=3)
        r.table(["adapter", "library", "version", "declared", *props],
                [[a.name, library_of(a), version(library_of(a)), declared(a),
                  *(cell.get((a.name, p), "") for p in props)] for a in adapters])
        skipped = sorted({(v["impl"], v["message"]) for v in verdicts if v["status"] == "skip" and v["message"] and
                          "not installed" in v["message"]})
        if skipped:
            r.text("Not checked here: " + "; ".join(f"{name} ({why})" for name, why in skipped))
    r.heading("Upstream bugs found", level=3)
    for (t, name, prop), known in sorted(KNOWN_FAILURES.items()):
        r.text(f"**{known.library} {known.version}**, {t} / `{name}` / `{prop}`: {known.what}.\n\n"
               f"```python\n{known.reproduce.rstrip()}\n```")
    r.heading("Speed next to ours", level=3)
    rows, where = speed_rows()
    r.table(["technique", "case", "implementation", "ms"], rows, source=where,
            caption="asv's time of one call, ours and the libraries' on the same inputs (AttentionForward, "
                    "LinearTime: the registered implementations are the benchmarks' grid); an adapter that cannot "
                    "run here has no value.")


def adapter_verdicts(technique: str, names: list[str]) -> list[dict]:
    """The adapters' verdicts `harness run` saved for this machine, or checked now (ci profile)."""
    from llm_inference_harness.engine import inputs, provenance, runner

    path = provenance.output_root() / "verdicts" / f"{technique}.json"
    if path.is_file():
        return [v for v in inputs.verdicts(path)["verdicts"] if v["impl"] in names]
    results = runner.check(technique, [runner.Target(technique, name=n) for n in names], profile="ci")
    return [v.as_dict() for r in results for v in r.verdicts]


def declared(impl) -> str:
    """What the adapter declares beyond the defaults (its formats, conventions, dtypes), for the table."""
    caps = {k: v for k, v in impl.caps.declared().items() if k != "call_limit_s"}
    return ", ".join([f"dtypes {'/'.join(impl.dtypes)}", *(f"{k}={v}" for k, v in caps.items())])


SPEED = [  # (technique, asv benchmark, the case's parameters with "*" for the implementation, what it is, ours)
    ("attention", "bench_attention.AttentionForward.time_forward", ("*", "cpu", "1x8x512x64", True),
     "(1, 8, 512, 64) float32, causal", ("sdpa", "fa2_lazy_rescale_128x256")),
    ("quantized_linear", "bench_quantization.LinearTime.time_matmul", ("*", "cpu", 1024),
     "1024 tokens through a linear layer", ("float", "w8a8_token", "weight_only_channel")),
]


def speed_rows() -> tuple[list[list], str]:
    """(technique, case, implementation, ms) rows of ours and the adapters, read from asv's results, and the
    machines and commits they came from."""
    from llm_inference_harness.bench.report.asvdata import values
    from llm_inference_harness.engine.registry import impls

    rows, sources = [], set()
    for technique, benchmark, case, what, ours in SPEED:
        try:
            times = values(benchmark)
        except NotImplementedError:
            continue
        adapters = tuple(i.name for i in impls(technique) if i.source.startswith(SOURCE))
        for name in (*ours, *adapters):
            key = tuple(name if c == "*" else c for c in case)
            if key in times:
                rows.append([technique, what, name, times[key] * 1e3])
                sources.add(str(times.sources[key]))
    return rows, "; ".join(sorted(sources)) or "nowhere (no asv result here yet)"
