"""The asv dashboard, published from the committed results into a temporary folder and opened in a real
headless Chromium.

Serves the folder on localhost, waits for asv's JavaScript to render the benchmark list and a graph,
checks that every benchmarks/bench_<technique>.py appears and that the graph has data points, and saves
a screenshot next to the published pages.  Chromium and its driver come from Debian's packages; the
fixture installs them when missing and it runs as root.
"""

import functools
import http.server
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from harness.dashboard import publish

ROOT = Path(__file__).resolve().parents[1]
# the harness timing itself (check's time to verdict, compare's detection power) is not a technique, and takes too
# long for a history: the dashboard lists it once a full sweep's results are committed
SELF = {"check", "harness"}
TECHNIQUE_FILES = sorted({p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py")} - SELF)
GRAPH = "bench_attention.SdpaRatio.track_best_tiled_over_sdpa"  # a headline ratio, backfilled over main's history


def _ensure_chromium() -> tuple[str, str]:
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"], check=True,
                       capture_output=True, env=env)
    return shutil.which("chromium"), shutil.which("chromedriver")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per request would bury the test output
        pass


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dashboard")
    assert publish(out) == 0, "asv publish of the committed results failed"
    return out


@pytest.fixture(scope="module")
def server(html):
    handler = functools.partial(QuietHandler, directory=str(html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/index.html"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the [test] extra")
    chromium, driver = _ensure_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,900"):
        options.add_argument(flag)
    b = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    yield b
    b.quit()


def _wait(browser, script: str, timeout: float = 60.0):
    from selenium.webdriver.support.ui import WebDriverWait

    ready = "if (typeof $ === 'undefined') return null;"  # jQuery (vendored) not loaded yet
    return WebDriverWait(browser, timeout, poll_frequency=0.25).until(lambda b: b.execute_script(ready + script))


def test_every_technique_is_listed(html, server, browser):
    """asv lists one machine and environment at a time; over the published ones (each page opened with its
    full parameter selection, as the machine buttons do) every benchmarks/bench_<technique>.py is listed."""
    import json
    from urllib.parse import quote

    listed = {}
    for params in json.loads((html / "index.json").read_text())["graph_param_list"]:
        query = "&".join(f"{quote(k)}={quote('[none]' if v is None else v)}" for k, v in params.items())
        browser.get(f"{server}#/summarylist?{query}")
        browser.refresh()  # a new hash alone does not re-render the list
        listed[params["machine"]] = listed.get(params["machine"], []) + _wait(
            browser, "var t = $('#summarylist-body table a').map(function(){return $(this).text()}).get();"
                     "return t.length ? t : null;")
    everything = " ".join(" ".join(names) for names in listed.values())
    missing = [t for t in TECHNIQUE_FILES if f"bench_{t}." not in everything]
    assert not missing, f"dashboard lists no benchmarks of {missing}; per machine it shows " + "; ".join(
        f"{m}: {sorted(set(n))[:8]}" for m, n in listed.items())


def longest_committed_series(benchmark: str) -> int:
    """The most commits at which one committed series (machine, environment, parameter combination) has a value
    of ``benchmark`` at its current version: what its dashboard graph must draw as one line."""
    import json

    version = json.loads((ROOT / "results" / "benchmarks.json").read_text())[benchmark]["version"]
    commits: dict[tuple, set] = {}
    for path in (ROOT / "results").glob("*/*-*.json"):
        if not (path.parent / "machine.json").is_file():  # results/local/: this machine's runs, not published
            continue
        data = json.loads(path.read_text())
        entry = dict(zip(data["result_columns"], data["results"].get(benchmark) or [], strict=False))
        if entry.get("version") != version:  # asv draws a benchmark's results at its current code only
            continue
        for i, value in enumerate(entry["result"] if isinstance(entry["result"], list) else []):
            if value is not None and value == value:  # NaN: not run
                commits.setdefault((path.parent.name, data["env_name"], i), set()).add(data["commit_hash"])
    return max(map(len, commits.values()), default=0)


def test_a_graph_shows_a_line_across_commits_with_its_legend_beside_it(html, server, browser):
    """The headline graph draws its longest committed series (the history backfill) as one line, no series is
    named after an interpreter's path, and the legend sits in its own column: no legend box overlaps the plot."""
    browser.get(f"{server}#{GRAPH}")
    points = _wait(browser, "var p = $('#main-graph').data('plot'); if (!p) return null;"
                            "var n = p.getData().map(function(s){ return s.data.filter(function(d){"
                            " return d[1] !== null; }).length; }); return n.length ? n : null;")
    browser.save_screenshot(str(html / "dashboard.png"))
    expected = longest_committed_series(GRAPH)
    assert expected > 1 and max(points) == expected, f"graph {GRAPH}: longest line {max(points)}, committed {expected}"
    boxes = browser.execute_script(
        "function box(e) { var r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }"
        "return {plot: box($('#main-graph canvas')[0]), legend: box($('#harness-legend')[0]),"
        " rows: $('#harness-legend tr').length, inside: $('#main-graph .legend').length,"
        " labels: $('#harness-legend td.legendLabel').map(function(){ return $(this).text(); }).get()};")
    (pl, pt, pr, pb), (ll, lt, lr, lb) = boxes["plot"], boxes["legend"]
    assert boxes["rows"] > 0 and boxes["inside"] == 0, boxes
    assert not [label for label in boxes["labels"] if "/" in label], boxes["labels"]  # no interpreter path
    assert ll >= pr or lr <= pl or lt >= pb or lb <= pt, f"legend {boxes['legend']} overlaps the plot {boxes['plot']}"


def test_headline_benchmarks_come_first(html, server, browser):
    from harness.asvrun import QUICK

    browser.get(f"{server}#")
    groups = _wait(browser, "var g = $('.benchmark-group').map(function(){ return this.id; }).get();"
                            "return g.length ? g : null;")
    assert groups[0] == "group-headline", groups
    names = browser.execute_script("return $('#group-headline a').map(function(){"
                                   " return $(this).attr('href').slice(1); }).get();")
    assert names and set(names) <= set(QUICK), names
