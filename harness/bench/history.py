"""History you can read: the headline benchmarks over main's history, as asv result files, one series per machine.

``backfill`` measures the quick pass's headline cases (llm_inference_harness.bench.asvrun.QUICK) at commits spread over
a branch's first-parent history, each commit in its own worktree and environment with one worker process
(llm_inference_harness.bench.compare's machinery), and writes results/<machine>/<commit>-<env>.json in asv's format, so
``asv publish`` draws lines across commits.  Each case is set up by its parameter *values*: asv would pass a
parameter index, which at an older commit -- whose registry listed other implementations -- names another
implementation.  A case an older commit cannot run (its module missing, an implementation not yet
registered) is recorded as not run there.

``normalize`` gives every result file the identity its series needs: the machine fields of its machine.json
(the same fields on every machine: provenance.asv_machine), and the interpreter's version where asv's
``--python=same`` recorded its path, so results of one machine and interpreter form one series.

    nice -n 19 python -m llm_inference_harness.bench.history backfill --commits 48  # docs/benchmarks.md: how long
    python -m llm_inference_harness.bench.history normalize results/
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from llm_inference_harness.bench import asvrun, compare
from llm_inference_harness.bench import results as results_paths
from llm_inference_harness.bench.results import COLUMNS
from llm_inference_harness.engine import environment, inputs, outputs, provenance

ROOT = provenance.ROOT
RESULTS = results_paths.COMMITTED
PER_CASE = [COLUMNS.index(c) for c in ("result", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75",
                                       "stats_number", "stats_repeat", "samples")]
SAMPLES = 3  # per case and commit (their quartiles are the spread the dashboard draws), fewer where they would
CASE_BUDGET_S = 150.0  # take more CPU seconds than this (CPU, not wall: on a loaded machine wall time is unbounded)


def env_identity(python: str | None = None) -> tuple[str, dict[str, str]]:
    """(asv environment name, requirements) of this interpreter: the config's matrix, with torch's installed
    version where it is not the pinned one (a GPU machine's), named as asv names environments."""
    import torch
    from asv.environment import get_env_name

    conf = json.loads((ROOT / "asv.conf.json").read_text())
    reqs = {name: values[0] for name, values in conf["matrix"]["req"].items()}
    if not torch.__version__.startswith(reqs.get("torch", "")):
        reqs["torch"] = torch.__version__
    python = python or ".".join(platform.python_version_tuple()[:2])
    return get_env_name("", python, reqs, {}), reqs


def normalize(results: Path = RESULTS, python: str | None = None) -> int:
    """Rewrite every result file under ``results``/<machine>/ to its machine.json's fields and its interpreter's
    version (``python``, default this one's, where a path was recorded); returns how many files changed."""
    changed = 0
    for machine_json in sorted(results.glob("*/machine.json")):
        machine = {k: v for k, v in inputs.asv_machine(machine_json).items() if k != "version"}
        for path in sorted(machine_json.parent.glob("*.json")):
            if path.name == "machine.json":
                continue
            data = inputs.asv_result(path)
            inputs.require(path, data, {"params": dict, "requirements": dict, "python": str})
            before = json.dumps(data, sort_keys=True)
            params = data["params"]
            if "/" in str(data.get("python", "")):
                version = python or ".".join(platform.python_version_tuple()[:2])
                data["python"] = params["python"] = version
            for key in ("machine", "arch", "cpu", "num_cpu", "ram", "os", "gpu"):
                params.pop(key, None)
            params.update(machine)
            from asv.environment import get_env_name

            data["env_name"] = get_env_name("", data["python"], data["requirements"], {})
            target = path.with_name(f"{data['commit_hash'][:8]}-{data['env_name']}.json")
            if json.dumps(data, sort_keys=True) != before or target != path:
                if target != path and target.exists():
                    data = merge(inputs.asv_result(target), data)
                outputs.write_text(target, json.dumps(data, indent=None, sort_keys=True) + "\n")
                if target != path:
                    path.unlink()
                changed += 1
    return changed


def merge(old: dict, new: dict) -> dict:
    """One commit's results: the newer run's cases replace the older's; cases it did not run keep their values
    (a run of a few cases leaves the others as they were, as asv does)."""
    out = dict(new, results=dict(old.get("results", {})))
    same_layout = old.get("result_columns") == new["result_columns"]
    for name, entry in new["results"].items():
        previous = out["results"].get(name)
        if same_layout and previous is not None and previous[1:3] == entry[1:3]:  # same grid and version
            entry = list(entry)
            ran = [v is not None and v == v for v in entry[0]]  # NaN != NaN: not run
            for c in PER_CASE:
                new_col = entry[c] if isinstance(entry[c], list) else [None] * len(ran)
                old_col = previous[c] if isinstance(previous[c], list) else [None] * len(ran)
                entry[c] = [n if r else o for n, o, r in zip(new_col, old_col, ran, strict=True)]
        out["results"][name] = entry
    return out


# ------------------------------------------------------------------------------------------ backfill
def spread(commits: list[str], n: int) -> list[str]:
    """n commits spread evenly over the list, its first and last included (all of them when n >= len)."""
    if n >= len(commits):
        return commits
    return [commits[round(i * (len(commits) - 1) / (n - 1))] for i in range(n)]


def coarse_to_fine(commits: list[str]) -> list[str]:
    """The same commits, ordered so that every prefix spans the whole range: both ends, the middle, the
    quarters, ... (a backfill stopped early still draws the whole history, only coarser)."""
    order: list[str] = []
    n = 2
    while len(order) < len(commits):
        order += [c for c in spread(commits, min(n, len(commits))) if c not in order]
        n = 2 * n - 1
    return order


def since(names: list[str], branch: str = "main") -> str:
    """The first commit of ``branch`` whose benchmarks/ defines one of the classes of these benchmarks."""
    firsts = []
    for name in names:
        module, cls = name.split(".")[:2]
        found = compare.git(ROOT, "log", "--first-parent", "--reverse", "--format=%H", "-S", f"class {cls}", branch,
                            "--", f"benchmarks/{module}.py").split()
        firsts += found[:1]
    order = compare.git(ROOT, "rev-list", "--first-parent", "--reverse", branch).split()
    return min(firsts, key=order.index) if firsts else order[0]


def measure_commit(python: Path, src: Path, cases: list[tuple[str, tuple]], suite: Path) -> dict[tuple, dict]:
    """{case: {"samples": [...], "started_at": ms, "duration": s} or {"skip": why}} at one commit, with the
    benchmark suite (and worker) in ``suite``; a worker that dies or hangs costs its case only."""
    start = lambda: compare.Worker(python, src, suite / "benchmarks", limit_s=1800,  # a loaded machine: ~10 min a case
                                   script=suite / "benchworker.py")
    out, worker = {}, start()
    for case in cases:
        try:
            out[case] = _measure_case(worker, *case)
        except RuntimeError as exc:
            out[case] = {"skip": str(exc).splitlines()[0]}
            worker = start()
    worker.close()
    return out


def _measure_case(worker: compare.Worker, name: str, params: tuple) -> dict:
    started = time.time()
    answer = worker.ask("setup", name=name, params=list(params))
    if not answer.get("ok"):
        return {"skip": answer.get("skip") or answer.get("error")}
    samples, cpu = [], 0.0
    while len(samples) < SAMPLES:
        sample = worker.ask("sample")
        if "error" in sample:
            worker.ask("teardown")
            return {"skip": sample["error"]}
        samples.append(sample["value"])
        cpu += sample["cpu"]
        if cpu * (len(samples) + 1) / len(samples) > CASE_BUDGET_S:
            break
    worker.ask("teardown")
    return {"samples": samples, "started_at": int(started * 1000), "duration": time.time() - started}


def result_file(sha: str, measured: dict[tuple, dict], benchmarks: dict, machine: dict) -> dict:
    """asv's result document (format 2) of one commit from ``measured``."""
    import itertools

    env_name, reqs = env_identity()
    python = ".".join(platform.python_version_tuple()[:2])
    results = {}
    for name in sorted({name for name, _ in measured}):
        b = benchmarks[name]
        grid = list(itertools.product(*b["params"])) if b["params"] else [()]
        columns = {c: [None] * len(grid) for c in ("result", "stats_q_25", "stats_q_75", "samples", "stats_number")}
        started, duration = [], 0.0
        for (n, params), m in measured.items():
            if n != name or "samples" not in m:
                continue
            i = grid.index(tuple(map(repr, params)))
            s = sorted(m["samples"])
            columns["result"][i] = statistics.median(s)
            columns["stats_q_25"][i], columns["stats_q_75"][i] = _quantile(s, 0.25), _quantile(s, 0.75)
            columns["samples"][i], columns["stats_number"][i] = m["samples"], 1
            started.append(m["started_at"])
            duration += m["duration"]
        results[name] = [columns["result"], b["params"], b["version"], min(started, default=None), duration, None,
                         None, columns["stats_q_25"], columns["stats_q_75"], columns["stats_number"],
                         [len(s) if s else None for s in columns["samples"]], columns["samples"], None]
    date = int(compare.git(ROOT, "log", "-1", "--format=%ct", sha)) * 1000
    return {"commit_hash": sha, "env_name": env_name, "date": date, "params": {**machine, "python": python, **reqs},
            "python": python, "requirements": reqs, "env_vars": {}, "result_columns": COLUMNS, "results": results,
            "durations": {}, "version": 2}


def _measured(folder: Path, sha: str, versions: dict[str, str]) -> bool:
    """Whether a result file of ``sha`` holds every one of these benchmarks at these versions (a backfill
    writes every case's entry, run or not)."""
    for path in folder.glob(f"{sha[:8]}-*.json"):
        results = inputs.asv_result(path)["results"]
        if all(name in results and results[name][2] == v for name, v in versions.items()):
            return True
    return False


def _quantile(sorted_values: list[float], q: float) -> float:
    position = q * (len(sorted_values) - 1)
    low, frac = int(position), position - int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] * (1 - frac) + sorted_values[high] * frac


def backfill(n: int = 48, branch: str = "main", bench: str | None = None, results: Path = RESULTS,
             first: str | None = None, shard: tuple[int, int] = (0, 1), only: list[str] | None = None) -> int:
    """Measure the cases at ``n`` commits spread over ``branch`` from ``first`` (or exactly at the commits
    ``only`` names), writing one asv result file per commit under ``results``/<machine>/."""
    machine = {k: v for k, v in provenance.asv_machine().items()}
    folder = results / machine["machine"]
    folder.mkdir(parents=True, exist_ok=True)
    outputs.write_text(folder / "machine.json", json.dumps({**machine, "version": 1}, indent=4) + "\n")
    benchmarks = asvrun.suite()
    suite = Path(tempfile.mkdtemp(prefix="harness-suite-"))  # the suite as it is now, for every commit
    shutil.copytree(ROOT / "benchmarks", suite / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(compare.WORKER, suite / "benchworker.py")
    head_python, head_src = compare.prepare("HEAD")
    with compare.Worker(head_python, head_src, suite / "benchmarks", script=suite / "benchworker.py") as w:
        cases = w.cases(bench or asvrun.regex(asvrun.QUICK))
    if only:
        commits = [compare.git(ROOT, "rev-parse", f"{c}^{{commit}}") for c in only]
    else:
        start = first or since(sorted({name for name, _ in cases}), branch)
        commits = spread(compare.git(ROOT, "rev-list", "--first-parent", "--reverse", f"{start}^..{branch}").split(),
                         n)
    done_file = compare.ENVS / f"backfill-{machine['machine']}.done"  # commits measured with this suite
    versions = {name: benchmarks[name]["version"] for name, _ in cases}
    stamp = hashlib.sha1(json.dumps([sorted(cases), versions], sort_keys=True).encode()).hexdigest()
    lines = done_file.read_text().split() if done_file.is_file() else []
    done = set(lines[1:]) if lines[:1] == [stamp] else set()
    done |= {sha for sha in commits if _measured(folder, sha, versions)}
    todo = [c for c in coarse_to_fine(commits) if c not in done][shard[0]::shard[1]]
    print(f"backfill: {len(cases)} cases x {len(todo)} commits of {branch} (shard {shard[0]}/{shard[1]}; "
          f"{len(done & set(commits))} of {len(commits)} done before) "
          f"into {folder}", flush=True)
    if not done:
        outputs.write_text(done_file, stamp + "\n")
    started = time.perf_counter()
    for k, sha in enumerate(todo):
        t = time.perf_counter()
        try:
            measured = measure_commit(*compare.prepare(sha), cases, suite)
        except RuntimeError as exc:  # a commit whose project does not install
            print(f"  {sha[:8]}: {str(exc).splitlines()[0]}", flush=True)
            continue
        document = result_file(sha, measured, benchmarks, machine)
        path = folder / f"{sha[:8]}-{document['env_name']}.json"
        if path.exists():
            document = merge(inputs.asv_result(path), document)
        outputs.write_text(path, json.dumps(document, sort_keys=True) + "\n")
        with done_file.open("a") as f:  # a resume log: a line torn by a kill matches no commit (measured again)
            f.write(sha + "\n")
        ran = sum("samples" in m for m in measured.values())
        eta = (time.perf_counter() - started) / (k + 1) * (len(todo) - k - 1)
        print(f"  [{k + 1}/{len(todo)}] {sha[:8]}: {ran}/{len(cases)} cases in {time.perf_counter() - t:.0f} s "
              f"(ETA {eta / 60:.0f} min)", flush=True)
    print(f"backfill: {(time.perf_counter() - started) / 60:.1f} min", flush=True)
    shutil.rmtree(suite, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_inference_harness.bench.history",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    b = sub.add_parser("backfill", help="measure the headline cases at commits spread over a branch")
    b.add_argument("--commits", type=int, default=48, help="how many commits (default 48; all: a large number)")
    b.add_argument("--branch", default="main")
    b.add_argument("--bench", metavar="REGEX", help="other cases than the quick pass's headline ones")
    b.add_argument("--results", type=Path, default=RESULTS, help="where to write (default: the committed results/)")
    b.add_argument("--shard", default="0/1", metavar="K/N", help="measure every N-th commit left to do, from the "
                   "K-th (0-based): N backfills in parallel, one per core, K = 0 .. N-1")
    b.add_argument("--since", metavar="COMMIT", help="the first commit to measure (default: the first whose "
                   "benchmarks/ defines one of the cases' classes)")
    b.add_argument("--commit", action="append", metavar="SHA", help="measure at this commit (repeatable) instead "
                   "of commits spread over the branch: e.g. the commits a benchmark's committed history has")
    nm = sub.add_parser("normalize", help="give result files their machine's fields and interpreter version")
    nm.add_argument("results", nargs="?", type=Path, default=RESULTS)
    nm.add_argument("--python", help="the interpreter version to record where a path was (default: this one's)")
    args = parser.parse_args()
    try:
        environment.check()
        if args.what == "backfill":
            return backfill(args.commits, args.branch, args.bench, args.results, args.since, _backfill_args(args),
                            args.commit)
        print(f"normalize: {normalize(args.results, args.python)} files rewritten")
    except inputs.UsageError as exc:
        parser.exit(2, f"{parser.prog} {args.what}: {exc}\n")
    return 0


def _backfill_args(args: argparse.Namespace) -> tuple[int, int]:
    """(K, N) of --shard K/N, after every argument of a backfill is checked: nothing is measured before."""
    k, sep, n = args.shard.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise inputs.UsageError(f"--shard {args.shard!r}: expected K/N with 0 <= K < N, e.g. 0/2 and 1/2 for two "
                                "backfills in parallel")
    if args.commits < 1:
        raise inputs.UsageError(f"--commits {args.commits}: expected a whole number >= 1")
    for commit in (args.branch, args.since, *(args.commit or ())):
        if commit is not None:
            compare.check_commit(commit)
    compare.check_pattern(args.bench)
    outputs.check_folder(args.results, "--results")
    return int(k), int(n)


if __name__ == "__main__":
    sys.exit(main())
