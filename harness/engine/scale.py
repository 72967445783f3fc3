"""The command line's way into the engine: the flags of ``check``, ``mutants`` and ``run`` that shard a run, pick
its executor and share its example database (docs/scale.md), and the calls that plan and run a document's units.

Without any of them a run is what it always was: `llm_inference_harness.engine.runner.check` / `kill_mutants` on this
machine's forked children, no server.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from llm_inference_harness.engine import exampledb, runner
from llm_inference_harness.engine.executors import Local, Ray
from llm_inference_harness.engine.units import (
    Durations,
    Job,
    Plan,
    Shard,
    Unit,
    check_units,
    gather,
    mutant_units,
    plan,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scaling out (docs/scale.md)")
    g.add_argument("--shard", metavar="I/N", type=_shard, help="run shard I of N: the units (implementation x "
                   "property, mutants) cut into N parts of equal expected time; `harness merge` joins the documents")
    g.add_argument("--durations", metavar="PATH", action="append", default=[], help="verdicts documents (files or "
                   "folders) of a previous run whose times balance the shards (every shard must get the same)")
    g.add_argument("--executor", choices=("local", "ray"), default="local", help="where units run: this machine's "
                   "processes (default) or a Ray cluster (the [cluster] extra)")
    g.add_argument("--address", metavar="ADDR", help="--executor ray: the cluster's address (default: RAY_ADDRESS, "
                   "else a new local Ray instance)")
    g.add_argument("--example-db", metavar="URL", help="a Redis server (redis://HOST:PORT/DB) whose Hypothesis "
                   "examples are replayed first (also HARNESS_EXAMPLE_DB); this run's go to a local folder")
    g.add_argument("--example-db-write", action="store_true", help="write this run's failing examples to the Redis "
                   "server too (also HARNESS_EXAMPLE_DB_WRITE=1)")


def _shard(text: str) -> Shard:
    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass
class Scale:
    shard: Shard | None = None
    durations: Durations = field(default_factory=Durations)
    executor: Local | Ray | None = None  # None: local, the runner called as an unsharded run always called it
    address: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Scale:
        """ValueError (a usage error) for an unreadable durations file or an unreachable cluster.  The example
        database is set by the command line's validation, before any property module is imported
        (llm_inference_harness.cli._example_db)."""
        durations = Durations.load(args.durations)
        executor = Ray(args.address, durations=durations) if args.executor == "ray" else None
        if args.address and executor is None:
            raise ValueError("--address needs --executor ray")
        if executor is not None:
            executor.connect()  # here: a cluster that cannot be reached is a usage error, before any work
        return cls(args.shard, durations, executor)

    @property
    def plain(self) -> bool:
        """An unsharded local run without a shared example database: the runner as it always was."""
        return self.shard is None and self.executor is None and not exampledb.enabled()

    def plan_check(self, technique: str, targets: list[runner.Target], props: list[str]) -> Plan:
        return plan(check_units(technique, targets, props), self.shard, self.durations)

    def plan_mutants(self, techniques: list[str]) -> Plan:
        return plan(mutant_units(techniques), self.shard, self.durations)

    def check(self, technique: str, plan_: Plan, *, profile: str, properties: list[str], jobs: int,
              progress: runner.Progress, blob: str | None, shrink: bool) -> list[runner.ImplResult]:
        if self.plain:
            targets = list(dict.fromkeys(u.target for u in plan_.units))
            return runner.check(technique, targets, profile=profile, properties=properties, jobs=jobs,
                                progress=progress, blob=blob, shrink=shrink)
        return self._run(plan_.units, Job(profile, shrink=shrink, blob=blob), progress, jobs)

    def kill_mutants(self, technique: str, plan_: Plan, *, profile: str, jobs: int, progress: runner.Progress,
                     all_properties: bool) -> list[runner.ImplResult]:
        if self.plain:
            return runner.kill_mutants(technique, profile=profile, jobs=jobs, progress=progress,
                                       all_properties=all_properties)
        units = [u for u in plan_.units if u.technique == technique]
        return self._run(units, Job(profile, all_properties=all_properties), progress, jobs)

    def _run(self, units: list[Unit], job: Job, progress: runner.Progress, jobs: int) -> list[runner.ImplResult]:
        if not units:
            return []
        executor = self.executor or Local(jobs)
        return gather(units, executor.run(units, job, progress))

    def annotate(self, document: dict, plan_: Plan) -> dict:
        """The document with its shard's record and, from a cluster, where its units ran."""
        if plan_.record:
            document["shard"] = plan_.record
        if isinstance(self.executor, Ray):
            nodes: dict[str, int] = {}
            placements = self.executor.placements
            for placement in (placements[u.key] for u in plan_.units if u.key in placements):
                where = f"{placement['host']}/{placement['node'][:8]}"
                nodes[where] = nodes.get(where, 0) + 1
            document["executor"] = {"name": "ray", "address": self.executor.address, "units_per_node": nodes}
        return document

    def has(self, plan_: Plan, technique: str, name: str) -> bool:
        return any(u.technique == technique and u.target.name == name for u in plan_.units)
