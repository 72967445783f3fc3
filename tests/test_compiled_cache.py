"""The compiled-C kernel's cache (impls/paged_attention/compiled.py) loads only what it built: a library swapped
into the cache -- one whose constructor would run on load -- is rebuilt, never loaded, and the cache directory
is private."""

import os
import shutil
import stat
import subprocess

import pytest

compiled = pytest.importorskip("llm_inference_harness.impls.paged_attention.compiled")
pytestmark = pytest.mark.skipif(compiled.COMPILER is None, reason="no C compiler on PATH: the kernel is not offered")

EVIL = r"""
#include <stdio.h>
__attribute__((constructor)) static void on_load(void) { FILE *f = fopen(MARKER, "w"); if (f) fclose(f); }
int paged_attention_f32(void) { return 0; }
int paged_attention_f64(void) { return 0; }
"""


def evil_library(tmp_path, marker):
    source = tmp_path / "evil.c"
    source.write_text(EVIL)
    out = tmp_path / "evil.so"
    subprocess.run([compiled.COMPILER, f'-DMARKER="{marker}"', "-shared", "-fPIC", str(source), "-o", str(out)],
                   check=True)
    return out


def test_a_fresh_build_is_verified_in_a_private_directory(tmp_path):
    cache = tmp_path / "cache"
    path = compiled.build(cache)
    assert compiled.verified(path)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


def test_a_tampered_library_is_rebuilt_and_never_loaded(tmp_path):
    cache, marker = tmp_path / "cache", tmp_path / "constructor-ran"
    path = compiled.build(cache)
    shutil.copy(evil_library(tmp_path, marker), path)  # same name, foreign content
    assert not compiled.verified(path)
    lib = compiled.library(cache)
    assert not marker.exists(), "the swapped-in library was loaded: its constructor ran"
    assert compiled.verified(path) and hasattr(lib, "paged_attention_f32")


def test_a_foreign_file_without_a_digest_is_rebuilt(tmp_path):
    cache, marker = tmp_path / "cache", tmp_path / "constructor-ran"
    path = compiled.build(cache)
    path.with_suffix(".sha256").unlink()
    shutil.copy(evil_library(tmp_path, marker), path)
    compiled.library(cache)
    assert not marker.exists() and compiled.verified(path)


def test_a_world_writable_cache_is_made_private(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o777)
    os.chmod(cache, 0o777)
    compiled.build(cache)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="only root can hand a directory to another user here")
def test_a_cache_owned_by_another_user_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)  # nobody
    with pytest.raises(RuntimeError, match="belongs to another user"):
        compiled.build(cache)
