"""The benchmark dashboard, published to work offline: ``python -m llm_inference_harness.bench.dashboard [--serve]``.

The dashboard is generated output, never committed: `publish` builds it from the result files of one or more results
folders (the committed results/<machine>/*.json by default) into llm_inference_harness.bench.results.html()
(results/local/html in a checkout) or any folder.  Its first page, index.html, is ours (`overview`): every benchmark
with a history, the longest first, one graph per machine (a series never mixes machines) with each point's spread, the
goal where the benchmark has one (llm_inference_harness.bench.asvrun.GOALS), the steps `compare` confirmed
(results/steps.json) marked with their commit, at most MAX_SERIES series per panel.  asv's own pages (every benchmark,
every parameter, its regressions view) are published beside it as asv.html.  asv's pages pull jQuery, flot, bootstrap...
from CDNs: we copy the vendored files of harness/bench/dashboard_assets next to them and point every CDN link at them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from llm_inference_harness.bench import asvrun
from llm_inference_harness.bench import results as results_paths
from llm_inference_harness.bench.steps import recorded_steps
from llm_inference_harness.engine import inputs, outputs, provenance

ROOT = provenance.ROOT
ASSETS = Path(__file__).with_name("dashboard_assets")
MAX_SERIES = 6  # lines a reader can tell apart in one panel; more are faceted into further panels
# basename in the CDN url -> vendored file
LOCAL = {
    "jquery-3.3.1.min.js": "jquery.min.js",
    "jquery.flot.min.js": "jquery.flot.js",
    "jquery.flot.time.min.js": "jquery.flot.time.js",
    "jquery.flot.selection.min.js": "jquery.flot.selection.js",
    "jquery.flot.categories.min.js": "jquery.flot.categories.js",
    "jquery.flot.orderBars.js": "jquery.flot.orderBars.js",
    "stupidtable.min.js": "stupidtable.min.js",
    "md5.min.js": "md5.min.js",
    "bootstrap.min.js": "bootstrap.min.js",
    "bootstrap.min.css": "bootstrap.min.css",
}
OURS = ("harness.css", "overview.js", "overview.css")
CDN_TAG = re.compile(r'(src|href)="https://[^"]*/([^"/]+)"((?:\s+(?:integrity|crossorigin|referrerpolicy)="[^"]*")*)')
SIGNIFICANT = {"slower", "faster", "worse", "better", "higher", "lower"}


def publish(html_dir: Path | None = None, results: list[Path] | None = None, log: Path | None = None) -> int:
    """``asv publish`` of the machines found in ``results`` (folders holding <machine>/*.json; default the
    committed results/) into ``html_dir`` (default results_paths.html()), vendored for offline use, with our
    overview as its index.html; asv's output appended to ``log`` where one is given.  Built beside ``html_dir`` and
    put in its place whole (provenance.staged): a publish that fails or is killed leaves the previous dashboard."""
    html_dir = html_dir or results_paths.html()
    results = results or [results_paths.COMMITTED]
    suite = asvrun.suite()
    read_inputs(results)
    try:
        with provenance.staged(html_dir) as stage:
            _build(stage, results, suite, log)
    except _AsvFailed as failed:
        return failed.rc
    return 0


class _AsvFailed(Exception):
    def __init__(self, rc: int):
        super().__init__(f"asv publish exited {rc}")
        self.rc = rc


def _build(html_dir: Path, results: list[Path], suite: dict, log: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="harness-dashboard-") as tmp:
        merged = Path(tmp) / "results"
        merged.mkdir()
        for folder in results:
            for machine in results_paths.machines(folder):
                shutil.copytree(folder / machine, merged / machine, dirs_exist_ok=True)
        (merged / "benchmarks.json").write_text(json.dumps(suite))
        config = json.loads((ROOT / "asv.conf.json").read_text())
        config.update(repo=str(ROOT), results_dir=str(merged), html_dir=str(html_dir),
                      benchmark_dir=str(ROOT / "benchmarks"), env_dir=str(Path(tmp) / "env"))
        (Path(tmp) / "asv.conf.json").write_text(json.dumps(config))
        with open(log, "a") if log else contextlib.nullcontext() as out:
            rc = subprocess.run([sys.executable, "-m", "asv", "publish", "--config", str(Path(tmp) / "asv.conf.json")],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT if log else None).returncode
    if rc:
        raise _AsvFailed(rc)
    (html_dir / "index.html").rename(html_dir / "asv.html")
    vendorize(html_dir)
    data = overview(results, suite, recorded_steps())
    outputs.write_text(html_dir / "overview-data.js", f"window.HARNESS_OVERVIEW = {json.dumps(data)};\n")
    shutil.copy(ASSETS / "overview.html", html_dir / "index.html")


def read_inputs(results: list[Path]) -> None:
    """Every file `publish` hands to asv, validated first (llm_inference_harness.engine.inputs): a bad one is named in
    one line, not a traceback from inside asv."""
    for folder in results:
        if not folder.is_dir():
            raise inputs.UsageError(f"{folder}: no such results folder")
        for machine in sorted(folder.glob("*/machine.json")):
            inputs.asv_machine(machine)
            for path in sorted(machine.parent.glob("*.json")):
                if path != machine:
                    inputs.asv_result(path)
        if (folder / "benchmarks.json").is_file():
            inputs.asv_benchmarks(folder / "benchmarks.json")


def vendorize(html_dir: Path) -> None:
    """Copy the vendored scripts and ours into html_dir/vendor, rewrite CDN links in asv's html files, and apply
    our legibility changes to asv's pages (`legible`)."""
    (html_dir / "vendor").mkdir(exist_ok=True)
    for name in set(LOCAL.values()) | set(OURS):
        shutil.copy(ASSETS / name, html_dir / "vendor" / name)
    for page in html_dir.glob("*.html"):
        text = page.read_text()

        def local(m: re.Match) -> str:
            name = LOCAL.get(m.group(2))
            return f'{m.group(1)}="vendor/{name}"' if name else m.group(0)

        outputs.write_text(page, CDN_TAG.sub(local, text))
        left = [u for u in re.findall(r'(?:src|href)="(https://[^"]+)"', page.read_text()) if "cdn" in u]
        if left:
            raise RuntimeError(f"{page}: CDN links without a vendored copy: {left}")
    legible(html_dir)


def legible(html_dir: Path) -> None:
    """On asv's pages: a graph's legend goes into a column beside the plot (flot's ``legend.container``) instead
    of over the data, its labels leave out the fields the machine's name implies (as asv's leave out cpu, ram,
    os), a series without a point is not drawn, the summary grid starts with the headline benchmarks
    (llm_inference_harness.bench.asvrun.QUICK), and a link leads back to the overview."""
    page = html_dir / "asv.html"
    _patch(page, '<div id="graph">', '<div id="graph">\n<div id="harness-legend"></div>')
    _patch(page, "</head>", '<link href="vendor/harness.css" rel="stylesheet" type="text/css"/>\n'
           f"<script>window.HARNESS_HEADLINE = {json.dumps(list(asvrun.QUICK))};</script>\n</head>")
    _patch(page, '<li id="nav-li-" class="active">', '<li><a href="index.html">Overview</a></li>\n'
           '<li id="nav-li-" class="active">')
    _patch(html_dir / "graphdisplay.js", 'position: "nw",', 'container: $("#harness-legend"), noColumns: 1,')
    _patch(html_dir / "graphdisplay.js", "'ram': null", "'ram': null, 'gpu': null, 'num_cpu': null")  # the machine's
    _patch(html_dir / "graphdisplay.js", "orig_graphs.push({",
           "if (series.some(function (p) { return p[1] !== null; })) orig_graphs.push({")
    _patch(html_dir / "summarygrid.js", "var groups = {};",
           "var groups = {}, headline = $.grep(window.HARNESS_HEADLINE || [], function (n) {"
           " return n in main_json.benchmarks; });\n"
           "        if (headline.length) { groups.headline = headline; }")


def _patch(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if text.count(old) != 1:
        raise RuntimeError(f"{path.name}: expected one {old!r} to patch (asv's page changed?)")
    outputs.write_text(path, text.replace(old, new))


# ------------------------------------------------------------------------------------------ the overview
def overview(roots: list[Path], suite: dict, confirmed: list[dict]) -> dict:
    """The overview's data: one graph per (benchmark, machine) with a history (a series measured at two commits
    or more), the longest history first; the cases measured at one commit only, listed."""
    series: dict[tuple, dict] = defaultdict(dict)  # (benchmark, machine, env, params) -> {commit: point}
    for root in roots:
        for machine in results_paths.machines(root):
            for p in results_paths.points(root, machine):
                if p.benchmark in suite and p.version == suite[p.benchmark]["version"]:
                    series[p.benchmark, machine, p.env, p.params].setdefault(p.commit, p)
    by_graph: dict[tuple, dict] = defaultdict(dict)
    for (benchmark, machine, env, params), found in series.items():
        by_graph[benchmark, machine][env, params] = sorted(found.values(), key=lambda p: p.date)
    graphs, single = [], []
    for (benchmark, machine), cases in by_graph.items():
        longest = max(len(points) for points in cases.values())
        if longest < 2:
            single += [{"benchmark": benchmark, "machine": machine, "cases": len(cases),
                        "commit": next(iter(cases.values()))[0].commit[:8]}]
            continue
        graphs.append(_graph(benchmark, machine, cases, suite[benchmark], confirmed, longest))
    headline = list(asvrun.QUICK)
    graphs.sort(key=lambda g: (-g["history"], g["benchmark"] not in headline, g["benchmark"], g["machine"]))
    return {"graphs": graphs, "single": sorted(single, key=lambda s: (s["benchmark"], s["machine"])),
            "machines": {m: _machine_info(roots, m) for m in sorted({g["machine"] for g in graphs}
                                                                     | {s["machine"] for s in single})},
            "generated": {"commit": provenance.commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}}


def _graph(benchmark: str, machine: str, cases: dict, meta: dict, confirmed: list[dict], longest: int) -> dict:
    names = meta.get("param_names") or []
    envs = {env for env, _ in cases}
    varying = [i for i in range(len(names)) if len({params[i] for _, params in cases}) > 1]
    commits = sorted({p.commit: p.date for points in cases.values() for p in points}.items(), key=lambda c: c[1])
    x = {commit: i for i, (commit, _) in enumerate(commits)}
    goal = asvrun.GOALS.get(benchmark)
    marks = [dict(s, x=x[s["after"]]) for s in confirmed if s["machine"] == machine and s["benchmark"] == benchmark
             and s["compare"]["verdict"] in SIGNIFICANT and s["after"] in x]
    panels = []
    for facet, members in facets(sorted(cases, key=lambda c: (-len(cases[c]), c)), varying):
        panel_series = []
        for env, params in members:
            named = dict(zip(names, params, strict=False))
            label = ", ".join(f"{names[i]}={params[i]}" for i in varying if i not in facet) or _named(names, params)
            panel_series.append({"label": label + (f" ({env})" if len(envs) > 1 else ""), "params": named,
                                 "points": [[x[p.commit], p.value, p.q25, p.q75, p.commit[:8], p.samples]
                                            for p in cases[env, params]]})
        goal_here = goal is not None and any(goal.applies(s["params"]) for s in panel_series)
        drawn = {params for _, params in members}
        panels.append({"title": ", ".join(f"{names[i]}={members[0][1][i]}" for i in facet)
                       or _named(names, members[0][1], [i for i in range(len(names)) if i not in varying]),
                       "series": panel_series, "steps": [m for m in marks if tuple(m["params"]) in drawn],
                       "goal": {"value": goal.value, "better": goal.better} if goal_here else None})
    return {"benchmark": benchmark, "machine": machine, "unit": meta.get("unit"), "history": longest,
            "commits": [[c[:8], time.strftime("%Y-%m-%d", time.gmtime(d / 1000))] for c, d in commits],
            "panels": panels}


def _named(names: list[str], params: tuple, which: list[int] | None = None) -> str:
    return ", ".join(f"{names[i]}={params[i]}" for i in (range(len(names)) if which is None else which))


def facets(cases: list[tuple], varying: list[int]) -> list[tuple[tuple[int, ...], list[tuple]]]:
    """Split the cases (env, params) into panels of at most MAX_SERIES, grouped by the fewest parameters that
    achieve it (the split with the fewest panels), each panel's cases in the given order."""
    if len(cases) <= MAX_SERIES:
        return [((), cases)]
    for k in range(1, len(varying) + 1):
        splits = []
        for keys in itertools.combinations(varying, k):
            groups: dict[tuple, list] = {}
            for case in cases:
                groups.setdefault(tuple(case[1][i] for i in keys), []).append(case)
            if max(map(len, groups.values())) <= MAX_SERIES:
                splits.append((len(groups), keys, list(groups.values())))
        if splits:
            _, keys, groups = min(splits, key=lambda s: s[0])
            return [(keys, group) for group in groups]
    return [((), cases[i:i + MAX_SERIES]) for i in range(0, len(cases), MAX_SERIES)]


def _machine_info(roots: list[Path], machine: str) -> str:
    for root in roots:
        path = root / machine / "machine.json"
        if path.is_file():
            m = json.loads(path.read_text())
            return f"{m.get('cpu', '?')}, {m.get('num_cpu', '?')} CPUs, {m.get('ram', '?')}, GPU {m.get('gpu', 'none')}"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", action="append", type=Path, metavar="DIR",
                        help="a results folder of <machine>/*.json (repeatable; default: the committed results/)")
    parser.add_argument("--out", type=Path, default=None, help=f"where to write it (default {results_paths.html()})")
    parser.add_argument("--serve", action="store_true", help="then serve it on http://127.0.0.1:8080")
    args = parser.parse_args()
    out = args.out or results_paths.html()
    try:
        outputs.check_folder(out, "--out", parents=args.out is None)
        rc = publish(out, args.results)
    except inputs.UsageError as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
    print(f"dashboard: {out / 'index.html'}")
    if rc == 0 and args.serve:
        print("dashboard: http://127.0.0.1:8080/index.html  (Ctrl-C to stop)")
        subprocess.run([sys.executable, "-m", "http.server", "8080", "--bind", "127.0.0.1", "--directory",
                        str(out)])
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
