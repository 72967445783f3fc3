"""Running untrusted code in child processes it cannot escape.

Each job runs in a forked child that becomes its own session (so the terminal's Ctrl-C reaches only the
harness, and grandchildren share the child's process group), with its stdout and stderr captured to a
file and its address space capped.  The parent watches every child from one loop:

* a guarded call (llm_inference_harness.engine.guard) publishes its deadline in shared memory; past it plus `GRACE_S`
  -- the call caught the alarm, reset the timer or never returned to Python -- the whole process group gets
  SIGTERM, then SIGKILL;
* a child past its job's total limit, or dead, is reported as such; its grandchildren die with it;
* Ctrl-C in the parent ends every child and re-raises KeyboardInterrupt.

The parent does no tensor work before forking (torch's thread pools do not survive a fork).  Messages
from a child are pickled through a pipe: ("event", payload) tuples, and ("done", None) at the end.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from llm_inference_harness.engine import environment

GRACE_S = 3.0  # after a call's own limit: the alarm inside the call gets the first chance
TERM_WAIT_S = 1.0  # between SIGTERM and SIGKILL
OUTPUT_SHOWN = 2000  # characters of a child's captured output that a verdict quotes
OUTPUT_LIMIT = 2**30  # bytes of output after which a child is stopped (it would fill the disk)
POLL_S = 0.05


def default_memory_limit() -> int:
    """Bytes a child may add to its address space: HARNESS_MEMORY_LIMIT_GB, else half the machine's RAM,
    at most 16 GiB (two children at once still leave the machine its memory)."""
    gib = environment.value("HARNESS_MEMORY_LIMIT_GB")
    if gib is not None:
        return max(1, int(gib * 2**30))
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(16 * 2**30, ram // 2)


def per_impl_limit_s() -> float:
    """Seconds a whole job may take: HARNESS_PER_IMPL_LIMIT_S, else 900."""
    return environment.value("HARNESS_PER_IMPL_LIMIT_S")


@dataclass(frozen=True)
class Limits:
    total_s: float = field(default_factory=per_impl_limit_s)  # a whole job
    start_s: float | None = None  # until the job's first message (a check: importing and registering the plugin)
    memory_bytes: int = field(default_factory=default_memory_limit)


# --- inside a child -----------------------------------------------------------------------------------------
CHECKER_DIED = "crashed: the checking process"  # how a verdict starts whose checking process died without a word
_channel = None  # the pipe to the parent, in a child; None in the parent or under pytest
_deadline = None  # shared double: monotonic deadline of the guarded call in progress (0: none)
_memory_limit = 0  # bytes, in a child: what llm_inference_harness.engine.guard quotes when an allocation fails
_capture = ""  # in a child: the file its stdout and stderr go to
_slot: int | None = None  # in a child of several running at once: which one it is (0 .. workers - 1)


def send(kind: str, payload: Any = None) -> None:
    """Send a message to the parent (a no-op outside a child)."""
    if _channel is not None:
        _channel.send((kind, payload))


def note(text: str) -> None:
    """A line the parent prints while the job runs (why a property case is slow, say)."""
    send("note", text)


def set_deadline(seconds: float | None) -> None:
    """Publish the deadline of the guarded call starting now (None: the call ended)."""
    if _deadline is not None:
        _deadline.value = 0.0 if seconds is None else time.monotonic() + seconds


def memory_limit() -> int:
    return _memory_limit


def output_since(offset: int) -> tuple[str, int]:
    """(what the child printed since byte ``offset``, truncated to its last OUTPUT_SHOWN characters; the new
    offset).  Outside a child: ("", 0)."""
    if not _capture:
        return "", 0
    sys.stdout.flush()
    sys.stderr.flush()
    size = os.path.getsize(_capture)
    return (_tail(_capture, start=offset) if size > offset else ""), size


PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(parent: int) -> None:
    """In a freshly forked child: SIGKILL when the parent dies (the OS's guarantee), and exit now if it
    already did (the fork raced its death)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(70)


def capture_path() -> str:
    """The file this child's output goes to ('' outside a child): the implementation's process appends to it."""
    return _capture or os.devnull


def _child_main(conn, deadline, capture_path: str, limits: Limits, job: Callable[[], None], parent: int,
                slot: int | None) -> None:
    global _channel, _deadline, _memory_limit, _capture, _slot
    die_with_parent(parent)  # a killed harness takes its children along (they are in sessions of their own)
    os.setsid()  # its own session and process group: no terminal signals, one group to kill
    output_to(capture_path, truncate=True)
    _channel, _deadline, _capture, _slot = conn, deadline, capture_path, slot
    if limits.memory_bytes:
        _memory_limit = limits.memory_bytes
        cap_address_space(limits.memory_bytes)
    try:
        job()
        send("done")
    except Stopped as exc:
        send("stopped", str(exc))
    except BaseException as exc:  # noqa: BLE001 - reported, then the child exits
        send("error", "".join(traceback.format_exception(exc))[-4000:])
    finally:
        conn.close()


def slot() -> int | None:
    """Which of the children running at once this one is (a pytest-xdist worker: its number); None elsewhere (one
    child at a time, a Ray task: other processes may share the machine)."""
    if _slot is not None:
        return _slot
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker[:2] == "gw" and worker[2:].isdigit() else None


class Stopped(Exception):
    """A job that cannot go on, and says why in the words of a stopped child ("crashed: ...", "error: ...")."""


def output_to(path: str, *, truncate: bool) -> None:
    """This process's output (descriptors 1 and 2, and whatever stood in for sys.stdout in the parent: a notebook's
    stream, pytest's capture, redirect_stdout) appended to the file ``path``, emptied first if ``truncate``."""
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0), 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)


def cap_address_space(nbytes: int) -> None:
    """This process's address space capped at what it maps now plus ``nbytes`` (within the hard limit): an
    allocation past it fails at once instead of paging the machine to death."""
    with open("/proc/self/statm") as f:
        cap = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + nbytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = cap if hard == resource.RLIM_INFINITY else min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


# --- in the parent ------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """How a child ended: its messages in order, and why it stopped when it did not finish ("" if it did)."""

    events: list[Any] = field(default_factory=list)
    stopped: str = ""  # "", or "hung: ...", "crashed: ...", "exceeded ...", "error: ..."
    output: str = ""  # the tail of its captured stdout/stderr
    ended: float = 0.0  # monotonic time it ended


class _Child:
    def __init__(self, key: Any, job: Callable[[], None], limits: Limits, slot: int | None = None) -> None:
        ctx = multiprocessing.get_context("fork")
        self.key, self.limits, self.slot = key, limits, slot
        self.deadline = ctx.Value("d", 0.0, lock=False)
        fd, self.capture = tempfile.mkstemp(prefix="harness-child-", suffix=".log")
        os.close(fd)
        parent_end, child_end = ctx.Pipe(duplex=False)
        self.conn = parent_end
        self.proc = ctx.Process(target=_child_main,
                                args=(child_end, self.deadline, self.capture, limits, job, os.getpid(), slot),
                                daemon=True)
        self.proc.start()
        child_end.close()
        self.started = time.monotonic()
        self.outcome = Outcome()
        self.finished = False

    def poll(self, on_event: Callable[[Any, str, Any], None]) -> bool:
        """Read what the child sent, enforce the limits; True once it is over."""
        try:
            while self.conn.poll():
                kind, payload = self.conn.recv()
                if kind == "done":
                    return self._end("")
                if kind == "error":
                    return self._end(f"error: the checking process failed: {payload.strip().splitlines()[-1]}",
                                     detail=payload)
                if kind == "stopped":
                    return self._end(str(payload))
                self.outcome.events.append((kind, payload))
                on_event(self.key, kind, payload)
        except (EOFError, OSError, ValueError):  # the child died mid-message or closed its end
            return self._end(self._death())
        now, deadline = time.monotonic(), self.deadline.value
        if deadline and now > deadline + GRACE_S:
            return self._end(f"hung: no result within the per-call limit, still running {now - deadline:.0f} s "
                             "past it (it caught the alarm or never returned to Python); its process group was "
                             "killed")
        if os.path.getsize(self.capture) > OUTPUT_LIMIT:
            return self._end(f"stopped: wrote more than {OUTPUT_LIMIT / 2**30:g} GiB of output")
        if now - self.started > self.limits.total_s:
            return self._end(f"hung: exceeded the per-implementation limit of {self.limits.total_s:g} s")
        start_s = self.limits.start_s
        if start_s is not None and not self.outcome.events and now - self.started > start_s:
            return self._end(f"hung: not imported and registered within the import limit of {start_s:g} s "
                             "(HARNESS_IMPORT_LIMIT_S)")
        if not self.proc.is_alive():
            return self._end(self._death())
        return False

    def _death(self) -> str:
        self.proc.join(timeout=1)
        code = self.proc.exitcode
        if code is not None and code < 0:
            return f"{CHECKER_DIED} was killed by signal {signal.Signals(-code).name}"
        return f"{CHECKER_DIED} died with exit code {code}"

    def _end(self, why: str, *, detail: str = "") -> bool:
        self.kill()
        self.outcome.stopped, self.outcome.ended = why, time.monotonic()
        self.outcome.output = _tail(self.capture) if why else ""
        if detail:
            self.outcome.output = (self.outcome.output + "\n" + detail).strip()
        self.finished = True
        return True

    def kill(self) -> None:
        """End the child's whole process group: SIGTERM, then SIGKILL for what is left (grandchildren too)."""
        pid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, TERM_WAIT_S), (signal.SIGKILL, 0)):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            end = time.monotonic() + wait
            while time.monotonic() < end and _group_alive(pid):
                time.sleep(0.02)
        self.proc.join(timeout=1)
        self.conn.close()

    def cleanup(self) -> None:
        try:
            os.unlink(self.capture)
        except FileNotFoundError:
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie leader still counts as a member: reap it
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass
    return True


def _tail(path: str, limit: int = OUTPUT_SHOWN, start: int = 0) -> str:
    """The last ``limit`` bytes of a file from byte ``start`` on, saying how many earlier ones were left out."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(start, size - limit))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    dropped = size - start - limit
    return (f"[... {dropped} earlier bytes not shown]\n" if dropped > 0 else "") + text


def run_all(jobs: list[tuple[Any, Callable[[], None]]], *, workers: int, limits: Limits | None = None,
            on_event: Callable[[Any, str, Any], None] = lambda key, kind, payload: None,
            on_tick: Callable[[], None] = lambda: None) -> dict[Any, Outcome]:
    """Run each ``(key, job)`` in its own child, ``workers`` at a time; the outcomes by key.

    ``on_event(key, kind, payload)`` sees every message as it arrives, ``on_tick()`` runs every poll.  Ctrl-C
    ends every child and re-raises KeyboardInterrupt.
    """
    limits = limits or Limits()
    pending, running, done = list(jobs), [], {}
    try:
        while pending or running:
            while pending and len(running) < max(1, workers):
                key, job = pending.pop(0)
                slot = min(set(range(len(running) + 1)) - {c.slot for c in running}) if workers > 1 else None
                running.append(_Child(key, job, limits, slot))
            for child in list(running):
                if child.poll(on_event):
                    done[child.key] = child.outcome
                    running.remove(child)
                    child.cleanup()
            on_tick()
            time.sleep(POLL_S)
    except BaseException:
        for child in running:
            child.kill()
            child.cleanup()
        raise
    return done


def events(outcome: Outcome, kind: str) -> Iterator[Any]:
    return (payload for k, payload in outcome.events if k == kind)
