"""Loading an implementation the user names on the command line, without registering it anywhere.

``--plugin my_attn.py:attention`` or ``--plugin my_pkg.kernels:attention``.  The object may be a
plain function (declare its capabilities with `declare`) or an `Impl` record.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.registry import Impl, make_impl


def declare(**capabilities: Any) -> Callable[[Callable], Callable]:
    """Attach declared capabilities to a plugin function: ``@declare(dtypes=("float32",), devices=("cpu",))``."""

    def mark(fn: Callable) -> Callable:
        fn.harness_declared = capabilities
        return fn

    return mark


def load_plugin(spec: str, technique: str) -> Impl:
    if ":" not in spec:
        raise ValueError(f"--plugin must be MODULE:ATTR or FILE.py:ATTR, got {spec!r}")
    where, attr = spec.rsplit(":", 1)
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"--plugin: no such file {where!r}")
        module_name = f"harness_plugin_{path.stem}_{abs(hash(str(path)))}"
        mod_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[module_name] = module
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    if not hasattr(module, attr):
        raise AttributeError(f"--plugin: {where} has no attribute {attr!r}")
    obj = getattr(module, attr)
    if isinstance(obj, Impl):
        return dataclasses.replace(obj, source=spec)  # the reproduce line names the spec, not the record's origin
    if not callable(obj):
        raise TypeError(f"--plugin: {spec} is a {type(obj).__name__}, not a function")
    declared = dict(getattr(obj, "harness_declared", {}))
    declared.setdefault("source", spec)
    return make_impl(technique, declared.pop("name", attr), obj, **declared)
