"""A process that forks implementation processes for a judge that has already computed things.

A fork of a process whose OpenMP threads have run deadlocks at its first parallel op (GNU libgomp), and would
carry the judge's memory -- expected outputs among it -- into the implementation's process.  A judge that runs
many cases before it needs an implementation's process (pytest: one session, many tests) forks a zygote first,
while it is still clean; the zygote forks each implementation's process on request (harness/engine/boundary.py's
``spawn``), hands the channel over with SCM_RIGHTS, and reports how a child ended.  It dies with its parent.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import time
from typing import Any

from llm_inference_harness.engine.boundary import describe_status
from llm_inference_harness.engine.isolation import die_with_parent


class Zygote:
    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            mine.close()
            _serve(theirs, parent)  # never returns
        theirs.close()
        self.sock, self.pid = mine, pid

    def spawn(self, fd: int, options: dict) -> tuple[int, Any]:
        """Fork an implementation's process with channel ``fd``: (its pid, how to learn how it ended)."""
        socket.send_fds(self.sock, [_frame(("spawn", options))], [fd])
        pid = self._reply()
        return pid, lambda: self._reply_to(("wait", pid))

    def _reply_to(self, request: tuple) -> Any:
        self.sock.sendall(_frame(request))
        return self._reply()

    def _reply(self) -> Any:
        return pickle.loads(_read_frame(self.sock))  # from the zygote: a process of this judge's own code

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.sock.close()


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj)
    return len(data).to_bytes(8, "little") + data


def _read_frame(sock: socket.socket, first: bytes = b"") -> bytes:
    head = first
    while len(head) < 8:
        chunk = sock.recv(8 - len(head))
        if not chunk:
            raise EOFError("the zygote closed its socket")
        head += chunk
    size, body = int.from_bytes(head[:8], "little"), head[8:]
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            raise EOFError("the zygote closed its socket")
        body += chunk
    return body


def _serve(sock: socket.socket, parent: int) -> None:
    """The zygote's loop: fork on "spawn", report on "wait"; exit when the judge's end closes."""
    from llm_inference_harness.engine import callserver, confine
    from llm_inference_harness.engine.registry import load_all

    die_with_parent(parent)
    load_all()  # imported once here, not in every process forked from here (imports compute nothing)
    me, ended = os.getpid(), {}
    try:
        while True:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
            if not data:
                break
            kind, arg = pickle.loads(_read_frame(sock, data))
            if kind == "spawn":
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    confine.main(fds[0], me, arg, callserver.serve)  # never returns
                os.close(fds[0])
                sock.sendall(_frame(pid))
            else:
                sock.sendall(_frame(_ended(arg, ended)))
    finally:
        os._exit(0)


def _ended(pid: int, ended: dict) -> str:
    """How child ``pid`` ended ('' if it still runs half a second on), reaping every child that has ended."""
    for _ in range(50):
        while True:
            try:
                done, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not done:
                break
            ended[done] = describe_status(status)
        if pid in ended:
            return ended.pop(pid)
        time.sleep(0.01)
    return ""
