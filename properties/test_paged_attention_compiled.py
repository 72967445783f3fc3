"""The C paged-attention kernel (impls/paged_attention/compiled.py) beyond the contract's shared properties.

Its loop order is fixed by the logical key order alone, so the bits of its output cannot depend on where
the blocks lie in the pool or on how many threads run it.  Its build is lazy (importing the harness never
compiles), cached per source/flags/compiler, and atomic under parallel builders.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.contracts.paged_attention import call
from harness.devices import available
from harness.runner import needs_cap
from harness.strategies.paged_attention import paged_attention_cases
from impls.paged_attention import compiled

TECHNIQUE = "paged_attention"
needs_compiler = pytest.mark.skipif(compiled.COMPILER is None, reason="no C compiler (gcc or cc) on PATH")


def moved(k_cache, v_cache, tables, seed):
    """The same sequences with every physical block moved to another place in the pool."""
    perm = torch.randperm(k_cache.shape[0], generator=torch.Generator().manual_seed(seed))  # old id -> new id
    k2, v2 = torch.empty_like(k_cache), torch.empty_like(v_cache)
    k2[perm], v2[perm] = k_cache, v_cache
    return k2, v2, perm[tables]  # (B, max_blocks)


@needs_cap("compiled", "a kernel whose loop order is fixed by logical key order")
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_bits_do_not_depend_on_placement_or_threads(impl, data, seed):
    case = data.draw(paged_attention_cases(dtypes=impl.dtypes, devices=available(impl.devices)), label="case")
    q, k_cache, v_cache, tables, seq_lens = case.paged()
    out = call(impl, q, k_cache, v_cache, tables, seq_lens, causal=case.causal, scale=case.scale)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3 - min(threads, 2))  # 1 thread <-> 2 threads
        again = call(impl, q, *moved(k_cache, v_cache, tables, seed), seq_lens, causal=case.causal, scale=case.scale)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out, again), f"{impl.name}: moving blocks / changing the thread count changed the output"


@needs_cap("compiled", "converts its inputs for the C signature")
@given(data=st.data())
def test_strided_inputs_and_int32_tables(impl, data):
    """A strided q and int32 tables and lengths give the bits of the contiguous int64 call."""
    case = data.draw(paged_attention_cases(dtypes=impl.dtypes, devices=available(impl.devices)), label="case")
    q, k_cache, v_cache, tables, seq_lens = case.paged()
    out = call(impl, q, k_cache, v_cache, tables, seq_lens, causal=case.causal, scale=case.scale)
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, Nq, d) laid out as (B, Nq, H, d)
    again = call(impl, strided, k_cache, v_cache, tables.int(), seq_lens.int(), causal=case.causal, scale=case.scale)
    assert torch.equal(out, again), f"{impl.name}: strided q / int32 tables changed the output"


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
    probe = ("from harness.registry import load_all; load_all(); from impls.paged_attention import compiled; "
             "print(compiled.library.cache_info().currsize)")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "0" and not any(tmp_path.iterdir()), "importing the harness built the kernel"
