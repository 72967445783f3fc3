"""The report's section on third-party implementations: each adapted library's version, its verdict per
property, the upstream bugs recorded next to its adapters (with their reproductions), and its speed next to
ours, measured here on the same inputs.  Registers with `harness.report.document.section`."""

from __future__ import annotations

import importlib.metadata

import torch

from harness.report.document import Report, section

TECHNIQUES = ("attention", "quantization", "quantized_linear", "sampling", "speculative")
SOURCE = "impls.external."
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
    from harness.registry import KNOWN_FAILURES, impls
    from harness.report.sections import MARKS

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
    r.table(["technique", "case", "implementation", "median ms"], speed_rows(),
            caption="Median wall time of one call on this machine (torch.utils.benchmark, 0.2 s per case), ours and "
                    "the libraries' on the same inputs; an adapter that cannot run here is left out.")


def adapter_verdicts(technique: str, names: list[str]) -> list[dict]:
    """The adapters' verdicts `python -m harness run` saved for this machine, or checked now (ci profile)."""
    from harness import provenance, runner
    from harness.engine import inputs

    path = provenance.output_root() / "verdicts" / f"{technique}.json"
    if path.is_file():
        return [v for v in inputs.verdicts(path)["verdicts"] if v["impl"] in names]
    results = runner.check(technique, [runner.Target(technique, name=n) for n in names], profile="ci")
    return [v.as_dict() for r in results for v in r.verdicts]


def declared(impl) -> str:
    """What the adapter declares beyond the defaults (its formats, conventions, dtypes), for the table."""
    caps = {k: v for k, v in impl.caps.declared().items() if k != "call_limit_s"}
    return ", ".join([f"dtypes {'/'.join(impl.dtypes)}", *(f"{k}={v}" for k, v in caps.items())])


def speed_rows() -> list[list]:
    """(technique, case, implementation, ms) for ours and the adapters on one case per technique."""
    import torch.utils.benchmark as tb

    from harness.registry import impls

    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(1024, 1024, generator=g), torch.randn(256, 1024, generator=g)
    q, k, v = (torch.randn(1, 8, 512, 64, generator=g) for _ in range(3))
    cases = [("quantization", "w (1024, 1024), 8 bits, groups of 32", "quantize",
              lambda i: lambda: i.fn(w, bits=8, granularity="group", group_size=32), ("absmax", "torch_fake_quant")),
             ("quantized_linear", "x (256, 1024) @ w (1024, 1024).T, 8 bits", "linear",
              lambda i: lambda: i.fn(x.to(dtype_for(i)), w.to(dtype_for(i)), bits=8),
              ("w8a8_token", "weight_only_channel")),
             ("attention", "(1, 8, 512, 64) float32, causal", "attention",
              lambda i: lambda: i.fn(q, k, v, causal=True), ("sdpa", "fa2_lazy_rescale_128x256"))]
    rows = []
    for technique, case, _, call, ours in cases:
        for impl in impls(technique):
            if impl.name not in ours and not (impl.source.startswith(SOURCE) and runnable(impl, technique)):
                continue
            try:
                fn = call(impl)
                fn()  # the first call imports the library
                ms = tb.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.2).median * 1e3
            except (ValueError, NotImplementedError):  # a format it does not serve
                continue
            rows.append([technique, case, impl.name, ms])
    return rows


def dtype_for(impl) -> torch.dtype:
    return torch.float32 if "float32" in impl.dtypes else getattr(torch, impl.dtypes[0])


def runnable(impl, technique: str) -> bool:
    from harness.devices import unavailable_reason

    if unavailable_reason(impl):
        return False
    if technique == "quantization":
        return "float32" in impl.dtypes and 8 in impl.caps.bits and "group" in impl.caps.granularities and (
            impl.caps.group_sizes is None or 32 in impl.caps.group_sizes)
    return technique != "attention" or "float32" in impl.dtypes
