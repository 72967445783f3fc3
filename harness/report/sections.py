"""The report's sections, in the order they appear."""

from __future__ import annotations

import argparse
import json

import torch

from harness.report import Report, section

MARKS = {"pass": "pass", "FAIL": "**FAIL**", "skip": "skip"}


def _verdicts(name: str) -> list[dict]:
    """Verdicts saved by `python -m harness run`; computed now when absent."""
    from harness import cli

    path = cli.VERDICTS / f"{name}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        args = argparse.Namespace(profile="ci", json=str(path))
        if name == "mutants":
            cli.cmd_mutants(argparse.Namespace(technique=None, **vars(args)))
        else:
            cli.cmd_check(argparse.Namespace(technique=name, impl=[], plugin=[], property=[], **vars(args)))
    return json.loads(path.read_text())


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
    from tqdm import tqdm

    from harness.registry import impls

    names = [i for i in impls("attention") if i.name != "reference" and "cpu" in i.devices and "float32" in i.dtypes]
    Ns = [256, 512, 1024, 2048]
    times: dict[str, list[float]] = {}
    g = torch.Generator().manual_seed(0)
    for N in tqdm(Ns, desc="attention forward", unit="N"):
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
    sdpa = times["sdpa"][-1]
    r.table(["implementation", "time at N=2048 (ms)", "ratio to SDPA"],
            sorted([[n, ts[-1] * 1e3, ts[-1] / sdpa] for n, ts in times.items()], key=lambda row: row[2]),
            caption="Measured in one run: lower is better; the best tiled ratio is the issue's goal (<= 1.0).")
