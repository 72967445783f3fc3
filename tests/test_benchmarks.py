"""asv collects every module-level function of benchmarks/ whose name has a benchmark prefix, so a helper
named like one (a `time_documents(samplers, rng)`) becomes a benchmark that fails on every run."""

import ast
from pathlib import Path

import pytest

PREFIXES = ("time_", "timeraw_", "track_", "mem_", "peakmem_")
BENCH_FILES = sorted((Path(__file__).parent.parent / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("path", BENCH_FILES, ids=lambda p: p.name)
def test_module_level_benchmarks_take_no_arguments(path):
    tree = ast.parse(path.read_text())
    helpers = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith(PREFIXES)
               and len(f.args.posonlyargs + f.args.args) > len(f.args.defaults)]  # a required argument
    assert not helpers, f"{path.name}: asv would run the helpers {helpers} as benchmarks; rename them"
