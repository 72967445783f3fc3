"""Where results go: every output path checked before the work starts, every result file written whole.

A command checks its output paths first (`check_file`, `check_folder`), so a path it cannot write is a
one-line usage error in the first second, not a result lost at the end of a long run.  The rules, the same
for every command: a file's folder must exist (it is not created); an output folder (`report --out DIR`,
HARNESS_OUT) is created if missing, in a folder that exists; the harness's own default folders under
results/local/ are created with their parents.  Writable means a file can be created there: the check
creates and removes one, which also catches a read-only filesystem that permission bits do not show.

Every result file is written through `replacing`: a temporary name in the destination's own folder, flushed
to disk, then renamed over the destination (os.replace, one rename(2) on one filesystem).  A run killed at any
moment leaves the previous file or the new one, never part of one.  A write that fails (the disk full, the
folder gone) raises OutputError naming the path and the reason.  A file another program wrote whole in a folder of
its own on the same filesystem (asv's results: llm_inference_harness.bench.asvrun) is put in place by `move`, the
same rename.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from llm_inference_harness.engine.inputs import UsageError


class OutputError(UsageError):
    """An output path that cannot be written: the flag, the path and why, in one line."""


def check_file(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a file a command may write: a non-empty name, not a folder, in a folder that exists and in
    which a file can be created.  Creates nothing that outlives the check."""
    if not str(path).strip():
        raise OutputError(f"{flag}: empty path; expected a file name")
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{flag} {path}: is a folder; expected a file name in it, e.g. {path / 'out.json'}")
    folder = path.parent
    if not folder.exists():
        raise OutputError(f"{flag} {path}: the folder {folder} does not exist (create it first)")
    if not folder.is_dir():
        raise OutputError(f"{flag} {path}: {folder} is a file, not a folder")
    _probe(folder, f"{flag} {path}")
    return path


def check_folder(path: str | os.PathLike, flag: str, *, parents: bool = False) -> Path:
    """``path`` as a folder a command may fill: an existing folder, or a missing one whose parent exists
    (``parents``: whose nearest existing ancestor is a folder, for the harness's own default locations), in
    which files can be created.  Creates nothing that outlives the check."""
    if not str(path).strip():
        raise OutputError(f"{flag}: empty path; expected a folder")
    path = Path(path)
    existing = path
    while not existing.exists():
        if existing.parent == existing or (existing != path and not parents):
            raise OutputError(f"{flag} {path}: the folder {existing} does not exist (create it first)")
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"{flag} {path}: {existing} is a file, not a folder")
    _probe(existing, f"{flag} {path}")
    return path


def _probe(folder: Path, what: str) -> None:
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".harness-probe-")
    except OSError as exc:
        raise OutputError(f"{what}: cannot create files in {folder}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path in ``path``'s folder (same suffix, so a writer that reads the format from the name --
    matplotlib's savefig -- writes the right one) that replaces ``path`` when the block ends without an
    exception, and is removed when it raises.  The file keeps the mode a new file would get (umask applied)
    or, when it replaces one, that file's mode."""
    path = Path(path)
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".partial{path.suffix}")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, _mode(path))
        with open(tmp, "rb+") as f:  # on disk before the rename: a crash then leaves the old file or the new one
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with replacing(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_bytes(path, text.encode())


def write_json(path: str | os.PathLike, document: object) -> Path:
    """``document`` as indented JSON (tuples and sets as lists), serialized before anything is written."""
    return write_text(path, json.dumps(document, indent=2, default=list) + "\n")


def move(source: str | os.PathLike, path: str | os.PathLike) -> Path:
    """``source``, a finished file, put in ``path``'s place (its folder created) by one rename after it is on disk,
    with the mode ``replacing`` gives; from another filesystem it is copied through ``replacing``."""
    source, path = Path(source), Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(source, _mode(path))
        with open(source, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(source, path)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
        write_bytes(path, source.read_bytes())
        source.unlink()
    return path
