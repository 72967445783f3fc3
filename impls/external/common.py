"""What every adapter of a third-party library shares: finding the library without importing it, and
importing it at the adapter's first call.

An adapter registers whether or not its library is installed: without it the record carries an
``unavailable`` reason (every property skips with it, ``harness list`` prints it, the benchmarks
show n/a), so CI without the ``external`` extra stays green and the matrix says what was not checked.  The
library is imported on first use, never at registration: torchao, bitsandbytes and transformers' generation
utilities take seconds each to import, and every process that lists the registry would pay for them.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import io
from dataclasses import dataclass
from types import ModuleType

from llm_inference_harness.engine.registry import library_unavailable

EXTRA = "pip install -e '.[external]'"
# The per-call limit of an adapter whose first call imports its library (transformers' Llama module, torchao,
# bitsandbytes: 5-20 s each on a loaded 2-core machine) -- as a JIT kernel's first call compiles.
FIRST_CALL_IMPORTS_S = 120.0


@dataclass(frozen=True)
class Library:
    """A third-party distribution an adapter calls: ``dist`` as pip names it, ``module`` as Python imports it."""

    dist: str
    module: str
    install: str = EXTRA

    @property
    def unavailable(self) -> str:
        return library_unavailable(self.module, install=self.install)

    @property
    def version(self) -> str:
        try:
            return importlib.metadata.version(self.dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    def load(self, name: str | None = None) -> ModuleType:
        """Import the library (or one of its modules), keeping what it prints at import out of the output: torchao
        reports each optional CUDA extension it cannot load on a CPU machine."""
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return importlib.import_module(name or self.module)
