"""The C paged-attention kernel's build (impls/paged_attention/compiled.py): lazy (importing the harness
compiles nothing), cached per source, flags and compiler, atomic under parallel builders; a failed build
raises with the compiler's output.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from llm_inference_harness.impls.paged_attention import compiled

needs_compiler = pytest.mark.skipif(compiled.COMPILER is None, reason="no C compiler (gcc or cc) on PATH")


@needs_compiler
def test_build_is_cached_and_atomic(tmp_path):
    with ThreadPoolExecutor(3) as pool:  # three builders race into one empty cache directory
        paths = list(pool.map(lambda _: compiled.build(tmp_path), range(3)))
    assert len(set(paths)) == 1 and sorted(tmp_path.iterdir()) == sorted([paths[0], paths[0].with_suffix(".sha256")]), (
        "one library and its digest, no temporary files left")
    built = paths[0].stat().st_mtime_ns
    assert compiled.build(tmp_path) == paths[0] and paths[0].stat().st_mtime_ns == built, "rebuilt a cached library"


@needs_compiler
def test_failed_build_raises_with_compiler_output(tmp_path, monkeypatch):
    broken = tmp_path / "broken.c"
    broken.write_text("int paged_attention_f32(void) { return }\n")
    monkeypatch.setattr(compiled, "SOURCE", broken)
    with pytest.raises(RuntimeError, match=r"(?s)failed \(exit \d+\):.*error"):
        compiled.build(tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == [], "a failed build left a file in the cache"


def test_importing_the_harness_compiles_nothing(tmp_path):
    probe = ("from llm_inference_harness.engine.registry import load_all; load_all(); "
             "from llm_inference_harness.impls.paged_attention import compiled; "
             "print(compiled.library.cache_info().currsize)")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "0" and not any(tmp_path.iterdir()), "importing the harness built the kernel"
