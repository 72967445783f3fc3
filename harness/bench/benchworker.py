"""A long-lived benchmark process for `llm_inference_harness.bench.compare` and `llm_inference_harness.bench.history`:
it imports one commit's code and a benchmark suite, then answers JSON requests on stdin, one line each.

Run by path (``python -c "import runpy; runpy.run_path(THIS)" SUITE``) with the commit's checkout as the working
directory and its environment's interpreter, so that ``harness`` and ``impls`` are that commit's while
``benchmarks`` is the suite at SUITE (one suite for both sides of a comparison, as asv does).  Only the standard
library is imported here: this file runs against commits whose harness predates it.

Semantics are asv's: module ``setup(*params)``, then the class's ``setup_cache()`` once (its value becomes the
first argument), ``setup(*params)``, the benchmark, ``teardown(*params)``; NotImplementedError in a setup is
a skip.  A ``time_`` sample is a block of calls (its size fixed at setup: at least SAMPLE_S of CPU time) and
reports the mean wall seconds per call and the fastest call's CPU seconds (the process's, all threads): calls
that a neighbour's process preempted, and that then refill their caches, cost more CPU time, never less.  A
``track_`` sample is one call's value.

Requests: {"op": "setup", "name": N, "params": [...], "number": calls per time_ sample (default: sized here),
"threads": torch's intra-op threads (default: as the benchmark leaves them)}
-> {"ok": true, "number": n, "unit": u} | {"skip": why} | {"error": why};
{"op": "sample", "cpu": k (optional: run it on CPU k only)} -> {"value": v, "cpu": c, "seconds": s};
{"op": "teardown"}; {"op": "exit"};
{"op": "list", "pattern": REGEX} -> {"cases": [[name, params], ...]}, matched as asv matches --bench:
against ``name`` and ``name(param, ...)`` with each parameter's repr.
"""

import importlib
import importlib.machinery
import inspect
import itertools
import json
import math
import os
import re
import sys
import time
import traceback

SAMPLE_S = 0.03  # CPU seconds of a time_ sample: several calls of a ms-scale benchmark, to take the fastest of


class SuiteImporter:
    """Imports the package ``benchmarks`` (and only it) from the suite's folder, as asv_runner does."""

    def __init__(self, suite: str) -> None:
        self.name, self.root = os.path.basename(suite), os.path.dirname(suite)

    def find_spec(self, fullname, path, target=None):
        if fullname == self.name:
            return importlib.machinery.PathFinder().find_spec(fullname, [self.root], target)
        return None


PREFIXES = ("time_", "track_")


def cases(suite: str, pattern: str) -> tuple[list, list]:
    """([name, params] of every benchmark case in the suite whose name (with its parameters) matches,
    [the modules that failed to import, with why])."""
    found, failed = [], []
    files = sorted(p for p in os.listdir(suite) if p.startswith("bench_") and p.endswith(".py"))
    named = [p for p in files if p[:-3] in pattern]  # a pattern naming modules needs only those imported
    for path in named or files:
        try:
            module = importlib.import_module(f"benchmarks.{path[:-3]}")
        except Exception as exc:  # noqa: BLE001 - a module this commit cannot import has no cases here
            failed.append(f"{path}: {type(exc).__name__}: {exc}")
            continue
        owners = [(n, c) for n, c in vars(module).items() if inspect.isclass(c) and c.__module__ == module.__name__]
        for owner, cls in [(None, module), *owners]:
            for attr in sorted(vars(cls)):
                if not attr.startswith(PREFIXES) or not callable(getattr(cls, attr)):
                    continue
                name = ".".join(x for x in (path[:-3], owner, attr) if x)
                params = getattr(cls, "params", []) if owner else []
                params = params if not params or isinstance(params[0], list) else [params]
                for combo in itertools.product(*params):
                    label = f"{name}({', '.join(map(repr, combo))})" if params else name
                    if re.search(pattern, label):
                        found.append([name, list(combo)])
    return found, failed


class Case:
    def __init__(self, name: str, params: list, number: int | None = None) -> None:
        module_name, *owner, method = name.split(".")
        self.module = importlib.import_module(f"benchmarks.{module_name}")
        self.owner = getattr(self.module, owner[0])() if owner else None
        self.fn = getattr(self.owner if owner else self.module, method)
        self.kind, self.params, self.args = method.split("_", 1)[0], list(params), list(params)
        self.number = 1
        if hasattr(self.module, "setup"):
            self.module.setup(*self.params)
        if self.owner is not None:
            if hasattr(self.owner, "setup_cache"):
                self.args = [self.owner.setup_cache(), *self.params]
            if hasattr(self.owner, "setup"):
                self.owner.setup(*self.args)
        if self.kind == "time":
            self.fn(*self.args)  # warm-up
            start = time.process_time()
            self.fn(*self.args)
            self.number = number or max(1, min(1000, int(SAMPLE_S / max(time.process_time() - start, 1e-6))))

    def sample(self) -> tuple[float, float]:
        """(the value, CPU seconds); for a time_ case, mean wall seconds per call and the fastest call's CPU time."""
        if self.kind != "time":
            cpu = time.process_time()
            return float(self.fn(*self.args)), time.process_time() - cpu
        fastest, start = math.inf, time.perf_counter()
        for _ in range(self.number):
            cpu = time.process_time()
            self.fn(*self.args)
            fastest = min(fastest, time.process_time() - cpu)
        return (time.perf_counter() - start) / self.number, fastest

    def teardown(self) -> None:
        if self.owner is not None and hasattr(self.owner, "teardown"):
            self.owner.teardown(*self.args)


def serve(suite: str, reply) -> None:
    sys.meta_path.insert(0, SuiteImporter(suite))
    case = None
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        try:
            if op == "setup":
                if case is not None:
                    case.teardown()
                case = None
                try:
                    if request.get("threads"):
                        import torch

                        torch.set_num_threads(request["threads"])
                    case = Case(request["name"], request["params"], request.get("number"))
                    answer = {"ok": True, "number": case.number, "unit": getattr(case.fn, "unit", None),
                              "higher_is_better": getattr(case.fn, "higher_is_better", None)}
                except NotImplementedError as exc:
                    answer = {"skip": str(exc) or type(exc).__name__}
            elif op == "sample":
                if request.get("cpu") is not None:  # this thread, the one a 1-thread benchmark runs in
                    os.sched_setaffinity(0, {request["cpu"]})
                start = time.perf_counter()
                value, cpu = case.sample()
                answer = {"value": value, "cpu": cpu, "seconds": time.perf_counter() - start}
            elif op == "list":
                found, failed = cases(suite, request["pattern"])
                answer = {"cases": found, "failed": failed}
            elif op == "teardown":
                if case is not None:
                    case.teardown()
                case, answer = None, {"ok": True}
            elif op == "exit":
                reply({"ok": True})
                sys.stderr.flush()
                os._exit(0)  # no interpreter teardown: torch's takes ~1 s, a comparison starts 20 workers
            else:
                answer = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # noqa: BLE001 - a failing benchmark is an answer, not the end of the worker
            case = None if op == "setup" else case
            answer = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        reply(answer)


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)  # our answers; the benchmarks' prints go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.argv[1], lambda answer: protocol.write(json.dumps(answer) + "\n"))


if __name__ == "__main__":
    main()
