"""The enumerator's pool: ``n`` forked processes that run round states' branches (`Workers`), and what any pool
sends back and how errors come home with the worker's traceback (`run_task`, `results_of`; the Ray pool in
llm_inference_harness.engine.enumeration_pool uses both)."""

from __future__ import annotations

import multiprocessing
import pickle
import threading
import time
import traceback
from collections.abc import Callable, Iterator

import torch

_JOB: Callable | None = None  # what a forked worker runs: set, under _FORK_LOCK, just before the fork
_FORK_LOCK = threading.Lock()


def _start_worker() -> None:
    torch.set_num_threads(1)  # two cores, two workers: intra-op threads would only contend


def _work(task: tuple):
    """A forked worker's entry point."""
    return run_task(_JOB, task)


def run_task(job: Callable, task: tuple):
    """("ok", job(*task), "") or ("error", exception, formatted traceback): what a worker sends back."""
    try:
        return "ok", job(*task), ""
    except BaseException as exc:  # noqa: BLE001 - everything a sampler raises travels back to the caller
        text = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle travels as its text
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        return "error", exc, text


class _RemoteTraceback(Exception):
    """The cause of an exception re-raised from a worker: the traceback the worker formatted."""

    def __str__(self) -> str:
        return f"\n(in an enumeration worker)\n{self.args[0]}"


class Workers:
    """``n`` forked processes running ``job``, started on first use; errors re-raised with their traceback."""

    def __init__(self, n: int, job: Callable) -> None:
        self.n, self.job, self.pool = n, job, None

    @property
    def started(self) -> bool:
        return self.pool is not None

    def start(self) -> bool:
        global _JOB
        if self.pool is None and self.n > 1:
            with _FORK_LOCK:
                _JOB = self.job
                try:
                    self.pool = multiprocessing.get_context("fork").Pool(self.n, initializer=_start_worker)
                finally:
                    _JOB = None
        return self.pool is not None

    def map(self, tasks: list, clock, ordered: bool = False) -> Iterator:
        """The tasks' results, the time spent waiting for them on ``clock``."""
        return results_of((self.pool.imap if ordered else self.pool.imap_unordered)(_work, tasks), clock)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def results_of(results: Iterator, clock) -> Iterator:
    """The results of `run_task` in a pool's order, an error re-raised with the worker's traceback as its cause;
    the time spent waiting for them on ``clock``."""
    while True:
        start = time.perf_counter()
        status, result, text = next(results, (None, None, None))
        clock.waiting += time.perf_counter() - start
        if status is None:
            return
        if status == "error":
            raise result from _RemoteTraceback(text)
        yield result
