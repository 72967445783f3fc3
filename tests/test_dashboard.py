"""The dashboard, published from the committed results into a temporary folder and opened in a real headless
Chromium.

The overview (index.html) must open on the series with the longest committed history, name the machine of every
graph, draw each point's spread and the goal, and draw no empty series and no more than six per panel, with
the legend off the data; asv's pages (asv.html) must list every benchmarks/bench_<technique>.py and start
their grid with the headline benchmarks.  The expected values are computed here from the committed result files.
A screenshot of the overview is saved next to the published pages.  Chromium and its driver come from Debian's
packages; the fixture installs them when missing and it runs as root.
"""

import functools
import http.server
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from llm_inference_harness.bench import asvrun
from llm_inference_harness.bench.dashboard import MAX_SERIES, publish

ROOT = Path(__file__).resolve().parents[1]
# the harness timing itself (check's time to verdict, compare's detection power) is not a technique, and takes too
# long for a history: the dashboard lists it once a full sweep's results are committed
SELF = {"check", "harness"}
TECHNIQUE_FILES = sorted({p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py")} - SELF)


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
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
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
        browser.get(f"{server}/asv.html#/summarylist?{query}")
        browser.refresh()  # a new hash alone does not re-render the list
        listed[params["machine"]] = listed.get(params["machine"], []) + _wait(
            browser, "var t = $('#summarylist-body table a').map(function(){return $(this).text()}).get();"
                     "return t.length ? t : null;")
    everything = " ".join(" ".join(names) for names in listed.values())
    missing = [t for t in TECHNIQUE_FILES if f"bench_{t}." not in everything]
    assert not missing, f"dashboard lists no benchmarks of {missing}; per machine it shows " + "; ".join(
        f"{m}: {sorted(set(n))[:8]}" for m, n in listed.items())


def committed_series() -> dict[tuple, dict[str, tuple]]:
    """{(benchmark, machine, params): {commit: (value, q25, q75)}} of the committed results at each benchmark's
    current version, read straight from the result files."""
    import itertools
    import json

    suite = asvrun.suite()
    found: dict[tuple, dict[str, tuple]] = {}
    for path in (ROOT / "results").glob("*/*-*.json"):
        if not (path.parent / "machine.json").is_file():  # results/local/: this machine's runs, not published
            continue
        data = json.loads(path.read_text())
        for benchmark, entry in data["results"].items():
            column = dict(zip(data["result_columns"], entry, strict=False))
            if benchmark not in suite or column.get("version") != suite[benchmark]["version"]:
                continue
            results = column["result"] if isinstance(column["result"], list) else [column["result"]]
            combos = list(itertools.product(*column["params"])) if column["params"] else [()]
            none = [None] * len(results)
            q25, q75 = column.get("stats_q_25") or none, column.get("stats_q_75") or none
            for i, (combo, value) in enumerate(zip(combos, results, strict=False)):
                if value is not None and value == value:  # NaN: not run
                    key = (benchmark, path.parent.name, tuple(p.strip("'") for p in combo))
                    found.setdefault(key, {})[data["commit_hash"]] = (value, q25[i], q75[i])
    return found


def _overview(browser, server) -> list[dict]:
    """Every graph of the overview as drawn: its benchmark, machine, heading, and per panel its flot series."""
    browser.get(f"{server}/index.html")
    _wait(browser, "return window.HARNESS_DRAWN || null;")
    return browser.execute_script("""
        function box(e) { var r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }
        return $('section.graph').map(function () {
          var section = $(this);
          return {benchmark: section.data('benchmark'), machine: section.data('machine'),
                  heading: section.find('h2').text(), about: section.find('p.about').text(),
                  panels: section.find('div.panel').map(function () {
                    var plot = $(this).find('div.plot').data('plot');
                    return {series: plot.getData().map(function (s) {
                              return {label: s.label || null, kind: s.harness.kind,
                                      points: s.data.filter(function (p) { return p !== null; }).length}; }),
                            markings: plot.getOptions().grid.markings.map(function (m) {
                              return m.yaxis ? m.yaxis.from : null; }),
                            legendRows: $(this).find('div.legend tr').length,
                            plotBox: box($(this).find('div.plot canvas')[0]),
                            legendBox: box($(this).find('div.legend')[0])};
                  }).get()};
        }).get();""")


def test_the_overview_opens_on_the_longest_history_with_its_spread_and_goal(html, server, browser):
    """The first graph is the committed series with the most commits, drawn as one line on its machine, a
    quartile bar for every point that has quartiles, and the goal line where the benchmark has a goal."""
    graphs = _overview(browser, server)
    browser.save_screenshot(str(html / "dashboard.png"))
    series = committed_series()
    (benchmark, machine, _), commits = max(series.items(), key=lambda kv: len(kv[1]))
    first = graphs[0]
    assert (first["benchmark"], first["machine"]) == (benchmark, machine), (first, len(commits))
    drawn = first["panels"][0]["series"]
    values = [s for s in drawn if s["kind"] == "value"]
    assert values[0]["points"] == len(commits) > 1, (values, len(commits))
    with_quartiles = sum(q25 is not None and q75 is not None for _, q25, q75 in commits.values())
    spread = next(s for s in drawn if s["kind"] == "spread")
    assert with_quartiles > 0 and spread["points"] == 2 * with_quartiles, (spread, with_quartiles)
    goal = asvrun.GOALS.get(benchmark)
    if goal is not None:
        assert goal.value in first["panels"][0]["markings"], first["panels"][0]["markings"]


def test_every_graph_names_one_machine_and_draws_no_empty_series(html, server, browser):
    """Each graph says its machine in its heading, its series are that machine's only (the points it draws are
    the committed points of that machine), none is empty, at most MAX_SERIES share a panel, and the legend
    (one row per drawn series) sits beside the plot, not on it."""
    series = committed_series()
    graphs = _overview(browser, server)
    assert graphs
    for graph in graphs:
        assert graph["machine"] in graph["heading"] and graph["machine"] in graph["about"], graph["heading"]
        ours = sum(len(c) for (b, m, _), c in series.items() if b == graph["benchmark"] and m == graph["machine"])
        drawn = 0
        for panel in graph["panels"]:
            values = [s for s in panel["series"] if s["kind"] == "value"]
            assert 0 < len(values) <= MAX_SERIES and all(s["points"] > 0 for s in values), values
            assert panel["legendRows"] == len(values) and all(s["label"] for s in values)
            (pl, pt, pr, pb), (ll, lt, lr, lb) = panel["plotBox"], panel["legendBox"]
            assert ll >= pr or lr <= pl or lt >= pb or lb <= pt, f"legend {panel['legendBox']} on {panel['plotBox']}"
            drawn += sum(s["points"] for s in values)
        assert drawn == ours, (graph["benchmark"], graph["machine"], drawn, ours)


def test_asv_pages_start_with_the_headline_benchmarks(html, server, browser):
    browser.get(f"{server}/asv.html#")
    groups = _wait(browser, "var g = $('.benchmark-group').map(function(){ return this.id; }).get();"
                            "return g.length ? g : null;")
    assert groups[0] == "group-headline", groups
    names = browser.execute_script("return $('#group-headline a').map(function(){"
                                   " return $(this).attr('href').slice(1); }).get();")
    assert names and set(names) <= set(asvrun.QUICK), names


def test_facets_split_by_the_fewest_parameters_into_panels_of_at_most_six():
    from llm_inference_harness.bench.dashboard import facets

    cases = [("env", (impl, "cpu", n, w)) for impl in ("a", "b") for n in (64, 128, 256, 512) for w in (128, 256)]
    panels = facets(cases, varying=[0, 2, 3])
    assert all(len(members) <= MAX_SERIES for _, members in panels)
    assert sorted(c for _, members in panels for c in members) == sorted(cases)
    assert [k for k, _ in panels] == [(2,)] * 4  # by n alone: 4 panels of 4 (by impl or width: 8 a panel)
    assert facets(cases[:5], varying=[0, 2, 3]) == [((), cases[:5])]


def test_overview_keeps_machines_apart_and_marks_only_significant_steps(tmp_path):
    import json

    from llm_inference_harness.bench.dashboard import overview
    from llm_inference_harness.bench.results import COLUMNS

    bench = "bench_x.C.track_v"
    for machine, values in (("vm-a", [1.0, 1.2, 1.21]), ("vm-b", [5.0, 5.1])):
        (tmp_path / machine).mkdir()
        (tmp_path / machine / "machine.json").write_text(json.dumps({"machine": machine, "cpu": "x", "version": 1}))
        for i, v in enumerate(values):
            entry = dict.fromkeys(COLUMNS)
            entry.update(result=[v, None], params=[["'cpu'", "'cuda'"]], version="v", stats_q_25=[v - 0.01, None],
                         stats_q_75=[v + 0.01, None], stats_repeat=[3, None])
            (tmp_path / machine / f"c{i}-env.json").write_text(json.dumps({
                "version": 2, "commit_hash": f"c{i}" * 10, "env_name": "env", "date": 1000 * i,
                "result_columns": COLUMNS, "results": {bench: [entry[c] for c in COLUMNS]}}))
    suite = {bench: {"version": "v", "param_names": ["device"], "unit": "x"}}
    steps = [{"machine": "vm-a", "benchmark": bench, "params": ["cpu"], "after": "c1" * 10,
              "compare": {"verdict": verdict, "ratio": 1.2}} for verdict in ("higher", "same")]
    data = overview([tmp_path], suite, steps)
    assert [(g["machine"], g["history"]) for g in data["graphs"]] == [("vm-a", 3), ("vm-b", 2)]
    (panel,) = data["graphs"][0]["panels"]
    assert [s["label"] for s in panel["series"]] == ["device=cpu"]  # the cuda case, never run, is no series
    assert [p[1:4] for p in panel["series"][0]["points"]] == [[1.0, 0.99, 1.01], [1.2, 1.19, 1.21], [1.21, 1.2, 1.22]]
    assert [(s["x"], s["compare"]["verdict"]) for s in panel["steps"]] == [(1, "higher")]
    assert data["graphs"][1]["panels"][0]["steps"] == []


def test_a_failed_publish_leaves_the_previous_dashboard(tmp_path, monkeypatch):
    """The dashboard is built beside its folder and put in place whole: asv failing leaves the old one as it was."""
    from llm_inference_harness.bench import dashboard

    html = tmp_path / "html"
    html.mkdir()
    (html / "index.html").write_text("the previous dashboard")
    run = subprocess.run  # asv publish fails; every other command runs

    def failing_publish(command, *args, **kwargs):
        return subprocess.CompletedProcess(command, 3) if "publish" in command else run(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", failing_publish)
    assert dashboard.publish(html) == 3
    assert [p.name for p in tmp_path.iterdir()] == ["html"]  # no staging folder left beside it
    assert (html / "index.html").read_text() == "the previous dashboard"
