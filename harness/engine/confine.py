"""The implementation's process before it loads anything: confined, then handed to what serves the judge.

`main` runs in a freshly forked child and never returns.  It dies with its parent (PR_SET_PDEATHSIG), becomes its
own session and process group, closes every descriptor but its channel, sends its output to a capture file, caps
its address space and, when the harness runs as root, drops to a user id of its own (no access to the judge's
memory, files or processes; `plugin_uid`); the marks of a test run are removed.  Then it runs ``serve(conn,
options)``, handed in by whoever started the process: the call server (harness/engine/callserver.py), or the
registry's probe of another distribution's module.  This module depends on nothing above the engine's core, so the
boundary that forks the process depends on nothing above itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

from llm_inference_harness.engine.isolation import cap_address_space, die_with_parent, output_to

PLUGIN_UID_BASE = 1_000_000_000  # the implementation's uid when the harness runs as root: this + its pid
PR_SET_KEEPCAPS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 8, 38, 47, 2
CAP_DAC_READ_SEARCH = 2
_CAPABILITY_VERSION_3 = 0x20080522


def main(fd: int, parent: int, options: dict, serve: Callable[[Connection, dict], None]) -> None:
    """The implementation's process: confined, then ``serve(its channel, options)``; exits, never returns."""
    code = 0
    try:
        die_with_parent(parent)
        os.setsid()
        _keep_only(fd)
        null = os.open(os.devnull, os.O_RDONLY)  # nothing to read: the judge's terminal is not the implementation's
        os.dup2(null, 0)
        os.close(null)
        output_to(options["capture"], truncate=False)
        if options.get("memory_bytes"):
            cap_address_space(options["memory_bytes"])
        if options.get("home"):
            plugin_uid(options["home"])
            die_with_parent(parent)  # a change of user id clears the parent-death signal: set it again
        _unmark()
        if options.get("one_thread"):
            import torch

            torch.set_num_threads(1)
        serve(Connection(fd), options)
    except BaseException:  # noqa: BLE001 - the judge reads it in the capture and sees the channel close
        traceback.print_exc()
        code = 70
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# What tells a process it is under test: the judge's environment and test frameworks.  Gone before the
# implementation is imported (it may import them itself; then they are fresh, and say nothing of the judge).
_TEST_MARKS = ("PYTEST_", "HYPOTHESIS", "HARNESS_", "CI", "GITHUB_", "TOX_", "_PYTEST")


def _unmark() -> None:
    for name in [n for n in os.environ if n.startswith(_TEST_MARKS)]:
        del os.environ[name]
    for name in [n for n in sys.modules if n.split(".")[0] in ("pytest", "_pytest", "hypothesis", "xdist",
                                                                   "pluggy", "execnet")]:
        del sys.modules[name]


def _keep_only(fd: int) -> None:
    """Close every descriptor this process inherited but the channel (the judge's pipe to its own parent, its
    capture file, anything): nothing the implementation can reach leads out of this process but the channel."""
    for name in os.listdir("/proc/self/fd"):
        n = int(name)
        if n > 2 and n != fd:
            with contextlib.suppress(OSError):
                os.close(n)


def plugin_uid(home: str) -> None:
    """Drop root: a user id no other process has, a home (and caches) of its own, and of root's powers only
    CAP_DAC_READ_SEARCH (read any file: the interpreter's standard library may live under /root).  From here the
    implementation can write only its home and /tmp, cannot signal, trace or read the memory of the judge, and
    cannot regain root by running a setuid program (PR_SET_NO_NEW_PRIVS)."""
    uid = PLUGIN_UID_BASE + os.getpid()
    os.chown(home, uid, uid)
    os.environ.update(HOME=home, TMPDIR=home, XDG_CACHE_HOME=os.path.join(home, ".cache"), USER="harness-plugin",
                      LOGNAME="harness-plugin", TRITON_CACHE_DIR=os.path.join(home, ".triton"),
                      TORCHINDUCTOR_CACHE_DIR=os.path.join(home, ".inductor"))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    mask = 1 << CAP_DAC_READ_SEARCH
    header = ctypes.create_string_buffer(struct.pack("Ii", _CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(struct.pack("IIIIII", mask, mask, mask, 0, 0, 0))  # effective, permitted,
    if libc.capset(header, data) != 0:  # inheritable: the low word holds CAP_DAC_READ_SEARCH, the high word none
        raise OSError(ctypes.get_errno(), "capset")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH, 0, 0)  # a compiler it runs reads too
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def where(exc: BaseException, plugin: str | None) -> str:
    """'file:line: ' of a SyntaxError, else of the innermost frame in the plugin's file (or, for a module, outside
    the harness and the libraries)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}: "
    frames = traceback.extract_tb(exc.__traceback__)
    path = os.path.abspath(plugin.rsplit(":", 1)[0]) if plugin and plugin.rsplit(":", 1)[0].endswith(".py") else ""
    mine = [f for f in frames if os.path.abspath(f.filename) == path] or [
        f for f in frames if not any(part in f.filename for part in ("/harness/", "importlib", "site-packages"))]
    return f"{mine[-1].filename}:{mine[-1].lineno}: " if mine else ""
