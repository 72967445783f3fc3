"""Loading an implementation the user names on the command line, without registering it anywhere.

``--plugin my_attn.py:attention`` or ``--plugin my_pkg.kernels:attention``.  The object may be a
plain function (declare its capabilities with `declare`) or an `Impl` record.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from llm_inference_harness.engine.registry import Impl, make_impl


def declare(**capabilities: Any) -> Callable[[Callable], Callable]:
    """Attach declared capabilities to a plugin function: ``@declare(dtypes=("float32",), devices=("cpu",))``."""

    def mark(fn: Callable) -> Callable:
        fn.harness_declared = capabilities
        return fn

    return mark


@dataclass(frozen=True)
class LoadFailure:
    """Why a plugin could not be loaded, and whose fault that is: ``"plugin"`` when its own code raised while being
    imported or declared what cannot be (a dtype that does not exist), ``"command"`` when the spec names nothing
    loadable (no such attribute, or not a function)."""

    spec: str
    fault: str  # "plugin" | "command"
    exception: str  # "SyntaxError: expected ':'"
    file: str = ""
    line: int | None = None
    trace: str = ""  # the plugin's part of the traceback (the harness's and importlib's frames left out)

    def __str__(self) -> str:
        where = f" ({self.file}{f', line {self.line}' if self.line else ''})" if self.file else ""
        return f"could not be loaded: {self.exception}{where}"


class PluginLoadError(Exception):
    def __init__(self, failure: LoadFailure) -> None:
        super().__init__(str(failure))
        self.failure = failure


def load_plugin(spec: str, technique: str) -> Impl:
    """The implementation ``spec`` names; PluginLoadError saying what went wrong, where and whose fault it is."""
    if ":" not in spec:
        raise ValueError(f"--plugin must be MODULE:ATTR or FILE.py:ATTR, got {spec!r}")
    where, attr = spec.rsplit(":", 1)
    path = Path(where).resolve() if where.endswith(".py") else None
    if path is not None and not path.is_file():
        raise FileNotFoundError(f"--plugin: no such file {where!r}")
    try:
        module = _import(where, path)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever the plugin's import raised is its verdict
        raise PluginLoadError(_failure(spec, exc, str(path or _origin(where)))) from exc
    source = getattr(module, "__file__", None) or where
    if not hasattr(module, attr):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == module.__name__)
        raise PluginLoadError(LoadFailure(spec, "command", f"{where} has no attribute {attr!r}; it defines "
                                          f"{', '.join(defined) or 'no function or class'}", source))
    obj = getattr(module, attr)
    if isinstance(obj, Impl):
        return dataclasses.replace(obj, source=spec)  # the reproduce line names the spec, not the record's origin
    if not callable(obj):
        raise PluginLoadError(LoadFailure(spec, "command", f"{where}:{attr} is not a function or class (its type: "
                                          f"{type(obj).__name__})", source))
    declared = dict(getattr(obj, "harness_declared", {}))
    declared.setdefault("source", spec)
    try:
        return make_impl(technique, declared.pop("name", attr), obj, **declared)
    except (TypeError, ValueError) as exc:  # its declaration: the line of its `def` (or of its first decorator)
        code = getattr(obj, "__code__", None)
        raise PluginLoadError(LoadFailure(spec, "plugin", _exception(exc), code.co_filename if code else source,
                                          code.co_firstlineno if code else None)) from exc


TRACE_SHOWN = 2000  # characters of a failed import's traceback a verdict quotes


def _import(where: str, path: Path | None) -> ModuleType:
    if path is None:
        return importlib.import_module(where)
    module_name = f"harness_plugin_{path.stem}_{abs(hash(str(path)))}"
    mod_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[module_name] = module
    mod_spec.loader.exec_module(module)
    return module


def _origin(module: str) -> str:
    """The file of a plugin named as a module, found without importing it ("" if it cannot be)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return ""
    return spec.origin if spec and spec.origin else ""


def _failure(spec: str, exc: BaseException, file: str) -> LoadFailure:
    """Where the import failed: a syntax error's own file and line; else the deepest line of the plugin's file in
    the traceback (the import statement or the call that raised), else the deepest line outside the harness and
    the import machinery."""
    machinery = (str(Path(__file__).parent), str(Path(importlib.__file__).parent), "<frozen")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(machinery)]
    trace = "".join(traceback.format_list(frames) + traceback.format_exception_only(exc))[-TRACE_SHOWN:]
    if isinstance(exc, SyntaxError):
        return LoadFailure(spec, "plugin", _exception(exc), exc.filename or file, exc.lineno, trace)
    ours = [f for f in frames if f.filename == file]
    frame = (ours or frames or [None])[-1]
    return LoadFailure(spec, "plugin", _exception(exc), frame.filename if frame else file,
                       frame.lineno if frame else None, trace)


def _exception(exc: BaseException) -> str:
    text = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}"[:300]
