"""Exact enumeration split over a Ray cluster: the judge composes, Ray actors run the branches.

`llm_inference_harness.sampling.enumeration.exact_distribution` visits every branch of a sampler's randomness; past
``parallel_after_runs`` runs it hands the pending branches of the current round state, then whole round states
one level at a time, to a pool of workers and sums the partial distributions they send back.  By default the
pool is forked processes of this machine; ``exact_distribution(..., workers=n, pool=RayPool)`` makes it ``n``
Ray actors, each holding its own enumerator (built from the same sampler and models: its own memo of model
calls, as a forked worker has) and running one task at a time.  The split and the sums are the enumerator's:
the distribution is the same, summed in another order.

A worker that dies (its node lost) is restarted by Ray and its task rerun (`MAX_RESTARTS`): a task is a pure
function of its round state and branches, so a rerun adds nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from llm_inference_harness.sampling.workers import results_of, run_task

MAX_RESTARTS = 3
CHUNKS_PER_ACTOR = 4  # per map: enough to even out unequal chunks, few enough that calls cost little


class _EnumerationWorker:
    """A Ray actor: the enumerator ``recipe`` builds, running `_Enumerator.task` for each task of a chunk sent."""

    def __init__(self, recipe: Callable) -> None:
        import torch

        torch.set_num_threads(1)  # thousands of tiny model calls: one thread each, as a forked worker
        self.enumerator = recipe()

    def tasks(self, tasks: list[tuple]) -> list:
        return [run_task(self.enumerator.task, task) for task in tasks]


class RayPool:
    """``n`` Ray actors (one CPU each) in place of `llm_inference_harness.sampling.enumeration._Workers`' forked
    processes, started on first use; the session is Ray's current one (``ray.init`` first), or a new local instance."""

    def __init__(self, n: int, recipe: Callable) -> None:
        self.n, self.recipe, self.actors = n, recipe, None
        self.closed = False

    @property
    def started(self) -> bool:
        return self.actors is not None

    def start(self) -> bool:
        if self.actors is None and self.n > 1:
            import ray

            worker = ray.remote(num_cpus=1, max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS)(
                _EnumerationWorker)
            self.actors = [worker.remote(self.recipe) for _ in range(self.n)]
        return self.actors is not None

    def map(self, tasks: list, clock, ordered: bool = False) -> Iterator:
        """The tasks' results (in order where ``ordered``), sent in `CHUNKS_PER_ACTOR` chunks per actor: a level of
        round states is thousands of tasks of a millisecond or two, and a Ray call costs about as much."""
        from ray.util import ActorPool

        size = max(1, -(-len(tasks) // (CHUNKS_PER_ACTOR * self.n)))
        chunks = [tasks[i:i + size] for i in range(0, len(tasks), size)]
        pool = ActorPool(self.actors)
        each = pool.map if ordered else pool.map_unordered
        done = each(lambda actor, chunk: actor.tasks.remote(chunk), chunks)
        return results_of((result for chunk in done for result in chunk), clock)

    def close(self) -> None:
        if self.actors is not None and not self.closed:
            import ray

            for actor in self.actors:
                ray.kill(actor)
            self.closed = True
