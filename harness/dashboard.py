"""Publish the asv dashboard so that it works offline: ``python -m harness.dashboard [--serve]``.

The dashboard is generated output, never committed: `publish` builds it with ``asv publish`` from the
result files of one or more results folders (the committed results/<machine>/*.json by default), through a
temporary asv configuration, into any folder.  asv's index.html pulls jQuery, flot, bootstrap... from CDNs;
after publishing we copy the vendored files of harness/dashboard_assets next to it and point every CDN
link at them.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.engine import inputs, outputs
from harness.provenance import ROOT

RESULTS = ROOT / "results"
HTML = RESULTS / "html"
ASSETS = Path(__file__).with_name("dashboard_assets")
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
CDN_TAG = re.compile(r'(src|href)="https://[^"]*/([^"/]+)"((?:\s+(?:integrity|crossorigin|referrerpolicy)="[^"]*")*)')


def publish(html_dir: Path = HTML, results: list[Path] | None = None) -> int:
    """``asv publish`` of the machines found in ``results`` (folders holding <machine>/*.json and a
    benchmarks.json; default the committed results/) into ``html_dir``, vendored for offline use."""
    results = results or [RESULTS]
    read_inputs(results)
    with tempfile.TemporaryDirectory(prefix="harness-dashboard-") as tmp:
        merged = Path(tmp) / "results"
        merged.mkdir()
        for folder in results:
            for machine in sorted(p for p in folder.iterdir() if (p / "machine.json").is_file()):
                shutil.copytree(machine, merged / machine.name, dirs_exist_ok=True)
            if (folder / "benchmarks.json").is_file():
                shutil.copy(folder / "benchmarks.json", merged / "benchmarks.json")
        config = json.loads((ROOT / "asv.conf.json").read_text())
        config.update(repo=str(ROOT), results_dir=str(merged), html_dir=str(html_dir),
                      benchmark_dir=str(ROOT / "benchmarks"), env_dir=str(Path(tmp) / "env"))
        (Path(tmp) / "asv.conf.json").write_text(json.dumps(config))
        rc = subprocess.run([sys.executable, "-m", "asv", "publish", "--config", str(Path(tmp) / "asv.conf.json")],
                            cwd=ROOT).returncode
    if rc == 0:
        vendorize(html_dir)
    return rc


def read_inputs(results: list[Path]) -> None:
    """Every file `publish` hands to asv, validated first (harness.engine.inputs): a bad one is named in one line,
    not a traceback from inside asv."""
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
    """Copy the vendored scripts into html_dir/vendor, rewrite CDN links in its html files, and apply our
    legibility changes (`legible`)."""
    (html_dir / "vendor").mkdir(exist_ok=True)
    for name in set(LOCAL.values()) | {"harness.css"}:
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
    """A graph's legend goes into a column beside the plot (flot's ``legend.container``) instead of over the
    data, its labels leave out the fields the machine's name implies (as asv's leave out cpu, ram, os), and the
    summary grid starts with the headline benchmarks (harness.asvrun.QUICK)."""
    from harness.asvrun import QUICK

    _patch(html_dir / "index.html", '<div id="graph">', '<div id="graph">\n<div id="harness-legend"></div>')
    _patch(html_dir / "index.html", "</head>", '<link href="vendor/harness.css" rel="stylesheet" type="text/css"/>\n'
           f"<script>window.HARNESS_HEADLINE = {json.dumps(list(QUICK))};</script>\n</head>")
    _patch(html_dir / "graphdisplay.js", 'position: "nw",', 'container: $("#harness-legend"), noColumns: 1,')
    _patch(html_dir / "graphdisplay.js", "'ram': null", "'ram': null, 'gpu': null, 'num_cpu': null")  # the machine's
    _patch(html_dir / "summarygrid.js", "var groups = {};",
           "var groups = {}, headline = $.grep(window.HARNESS_HEADLINE || [], function (n) {"
           " return n in main_json.benchmarks; });\n"
           "        if (headline.length) { groups.headline = headline; }")


def _patch(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if text.count(old) != 1:
        raise RuntimeError(f"{path.name}: expected one {old!r} to patch (asv's page changed?)")
    outputs.write_text(path, text.replace(old, new))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", action="append", type=Path, metavar="DIR",
                        help="a results folder of <machine>/*.json (repeatable; default: the committed results/)")
    parser.add_argument("--out", type=Path, default=HTML, help=f"where to write it (default {HTML})")
    parser.add_argument("--serve", action="store_true", help="then serve it on http://127.0.0.1:8080")
    args = parser.parse_args()
    try:
        outputs.check_folder(args.out, "--out", parents=args.out == HTML)
        rc = publish(args.out, args.results)
    except inputs.UsageError as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
    print(f"dashboard: {args.out / 'index.html'}")
    if rc == 0 and args.serve:
        print("dashboard: http://127.0.0.1:8080/index.html  (Ctrl-C to stop)")
        subprocess.run([sys.executable, "-m", "http.server", "8080", "--bind", "127.0.0.1", "--directory",
                        str(args.out)])
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
