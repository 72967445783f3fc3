"""What the harness is given, validated: `UsageError` for a bad argument, and readers of the files it reads back
(verdict documents, asv's result, benchmark and machine files, the report's record of what it could not run).

Each reader returns the parsed document or raises BadFile, whose message names the file and what is wrong
with it (empty, truncated, another schema, another version, a field missing or of the wrong type); a command
prints it as one line and exits 2, never a traceback, never a silently empty report.  Only what the harness
relies on is checked: a field it does not read may be anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from llm_inference_harness.engine.environment import UsageError as UsageError  # defined there, below provenance
from llm_inference_harness.engine.provenance import SCHEMA_VERSION as VERDICTS_VERSION

VERDICTS_SCHEMA = "llm-inference-harness/verdicts"  # docs/verdicts.md
STATUSES = ("pass", "FAIL", "skip", "upstream", "stale")
ASV_RESULTS_VERSION = 2  # asv's result and benchmarks.json format
ASV_MACHINE_VERSION = 1


class BadFile(UsageError):
    """A file the harness read and cannot use: its path and what is wrong, in one line."""

    def __init__(self, path: str | os.PathLike, what: str) -> None:
        super().__init__(f"{path}: {what}")
        self.path = Path(path)


def read_json(path: str | os.PathLike, expected: str) -> object:
    """The parsed JSON of ``path`` (``expected``: what it should hold, for the message)."""
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError:
        raise BadFile(path, f"not a text file; expected {expected}") from None
    except OSError as exc:
        raise BadFile(path, f"cannot read it ({exc.strerror or exc}); expected {expected}") from None
    if not text.strip():
        raise BadFile(path, f"empty; expected {expected}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        ends = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        end = " (the file ends inside the document: truncated?)" if ends else ""
        raise BadFile(path, f"not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{end}; "
                            f"expected {expected}") from None


def require(path, document: object, fields: dict[str, type | tuple[type, ...]], where: str = "") -> None:
    """BadFile unless ``document`` is an object holding each of ``fields`` with a value of its type."""
    if not isinstance(document, dict):
        raise BadFile(path, f"{where or 'the document'} is a JSON {type(document).__name__}, not an object")
    for name, kind in fields.items():
        if name not in document:
            raise BadFile(path, f"{where}{'.' if where else ''}{name} is missing")
        if not isinstance(document[name], kind):
            raise BadFile(path, f"{where}{'.' if where else ''}{name} is {type(document[name]).__name__} "
                                f"{_short(document[name])}, expected {_names(kind)}")


def _short(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
                        bool: "true/false"}.get(k, k.__name__) for k in kinds)


def _version(path, document: dict, field: str, expected: int, what: str) -> None:
    found = document.get(field)
    if found != expected:
        raise BadFile(path, f"{field} {found!r}: this harness reads {what} version {expected} "
                            f"({'a newer' if isinstance(found, int) and found > expected else 'another'} "
                            "harness or tool wrote it)")


def verdicts(path: str | os.PathLike) -> dict:
    """A verdicts document (docs/verdicts.md), of a check or of mutants."""
    document = read_json(path, "a verdicts document (docs/verdicts.md)")
    require(path, document, {"schema": str})
    if document["schema"] != VERDICTS_SCHEMA:
        raise BadFile(path, f"schema {document['schema']!r}, expected {VERDICTS_SCHEMA!r}")
    _version(path, document, "schema_version", VERDICTS_VERSION, "verdicts documents")
    require(path, document, {"kind": str, "commit": str, "machine": dict})
    require(path, document["machine"], {"name": str}, "machine")
    for i, technique in enumerate(document["techniques"] if _kind(path, document) == "mutants" else [document]):
        where = f"techniques[{i}]" if technique is not document else ""
        require(path, technique, {"technique": str, "verdicts": list}, where)
        for j, v in enumerate(technique["verdicts"]):
            at = f"{where}{'.' if where else ''}verdicts[{j}]"
            require(path, v, {"impl": str, "property": str, "status": str}, at)
            if v["status"] not in STATUSES:
                raise BadFile(path, f"{at}.status {v['status']!r}, expected one of {', '.join(STATUSES)}")
    return document


def _kind(path, document: dict) -> str:
    if document["kind"] not in ("check", "mutants"):
        raise BadFile(path, f"kind {document['kind']!r}, expected 'check' or 'mutants'")
    if document["kind"] == "mutants":
        require(path, document, {"techniques": list})
    return document["kind"]


def asv_result(path: str | os.PathLike) -> dict:
    """One asv result file (<results>/<machine>/<commit>-<env>.json): the fields the report and the history
    read."""
    document = read_json(path, "an asv result file")
    require(path, document, {"version": int})
    _version(path, document, "version", ASV_RESULTS_VERSION, "asv result files")
    require(path, document, {"commit_hash": str, "result_columns": list, "results": dict})
    columns = document["result_columns"]
    if "result" not in columns or "params" not in columns:
        raise BadFile(path, f"result_columns {_short(columns)} lacks 'result' or 'params'")
    for name, entry in document["results"].items():
        if not isinstance(entry, list) or len(entry) < 2:
            raise BadFile(path, f"results[{name!r}] is {_short(entry)}, expected a list of columns "
                                f"{', '.join(columns)}")
    return document


def asv_benchmarks(path: str | os.PathLike) -> dict:
    """asv's benchmarks.json: {benchmark: {..., "version": ...}, "version": 2}."""
    document = read_json(path, "asv's benchmarks.json")
    require(path, document, {"version": int})
    _version(path, document, "version", ASV_RESULTS_VERSION, "asv benchmarks.json")
    for name, entry in document.items():
        if name != "version":
            require(path, entry, {"version": str}, repr(name))
    return document


def asv_machine(path: str | os.PathLike) -> dict:
    """An asv machine file (<results>/<machine>/machine.json)."""
    document = read_json(path, "an asv machine.json")
    require(path, document, {"version": int})
    _version(path, document, "version", ASV_MACHINE_VERSION, "asv machine files")
    require(path, document, {"machine": str})
    if document["machine"] != Path(path).parent.name:
        raise BadFile(path, f"machine {document['machine']!r}, but the file is in the folder of "
                            f"{Path(path).parent.name!r}")
    return document


def string_list(path: str | os.PathLike, expected: str) -> list[str]:
    """A JSON list of strings (the report's record of what it could not run)."""
    document = read_json(path, expected)
    if not isinstance(document, list) or not all(isinstance(s, str) for s in document):
        raise BadFile(path, f"expected {expected}: a JSON list of strings, got {_short(document)}")
    return document
