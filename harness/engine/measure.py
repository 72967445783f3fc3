"""What docs/scale.md quotes, measured here: ``python -m llm_inference_harness.engine.measure overhead|enumeration``.

``overhead``: the cost of a unit beyond its property's own time.  The same units (every CPU implementation of
attention x quick properties) run one at a time on a one-CPU Ray cluster, then on this machine's local executor;
per unit, (wall time - the properties' seconds) / units.  A trivial Ray task's round trip is printed beside it.

``enumeration``: the exact enumeration of a table target and draft (vocabulary ``--vocab``, the benchmarks' seeded
tables) in one process, split over forked workers, and split over Ray actors on a cluster of as many one-CPU
nodes; the speedup of each.  The default, vocabulary 32 at gamma 3, T 4, is ~69,000 runs: past PARALLEL_AFTER_RUNS,
where the enumerator forks by default.

``plan``: what a run of ``--implementations`` implementations on ``--hosts`` hosts of ``--cores`` cores would take,
from recorded durations (``--durations``: a previous run's verdicts documents): implementations drawn, with their
recorded unit times, from those recorded (seeded), each unit charged ``--overhead`` seconds more; the wall time
of N shards (each host one shard, its units ``--cores`` at a time) and of Ray's dynamic dispatch (units longest
first, each to the first free core).  No cluster: arithmetic on the recorded times.

Both start their cluster on 127.0.0.1 and stop it; they print the load average they ran under, since on a
shared machine it moves every number.
"""

from __future__ import annotations

import argparse
import os
import time

QUICK = ["scores_1000_999_998_10", "rejects_bad_input", "empty_shapes_give_empty_output"]


def _cluster(nodes: int):
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray's import: every node on 127.0.0.1
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return ray, cluster


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def overhead(repeats: int) -> None:
    from llm_inference_harness.engine import profiles
    from llm_inference_harness.engine.executors import Local, Ray
    from llm_inference_harness.engine.registry import impls
    from llm_inference_harness.engine.runner import Progress, Target
    from llm_inference_harness.engine.units import Job, check_units

    profiles.load("ci")
    targets = [Target("attention", name=i.name) for i in impls("attention") if "cpu" in i.devices]
    units = check_units("attention", targets, QUICK)
    ray, cluster = _cluster(1)
    try:
        noop = ray.remote(lambda: None)
        ray.get(noop.remote())
        start = time.perf_counter()
        ray.get([noop.remote() for _ in range(200)])
        print(f"trivial Ray task: {(time.perf_counter() - start) / 200 * 1e3:.1f} ms each ({_load()})")
        for name, executor in [("ray, one CPU", Ray()), ("local, one job", Local(1))]:
            executor.run(units[:3], Job("ci"), Progress())  # warm: a Ray worker's imports, the first fork
            for _ in range(repeats):
                start = time.perf_counter()
                results = executor.run(units, Job("ci"), Progress())
                wall = time.perf_counter() - start
                busy = sum(v.seconds for r in results.values() for v in r.verdicts)
                print(f"{name}: {len(units)} units in {wall:.1f} s, properties {busy:.1f} s: "
                      f"{(wall - busy) / len(units) * 1e3:.0f} ms a unit beyond its property ({_load()})")
    finally:
        ray.shutdown()
        cluster.shutdown()


def enumeration(vocab: int, T: int, gamma: int, workers: int, repeats: int) -> None:
    from llm_inference_harness.engine.enumeration_pool import RayPool
    from llm_inference_harness.engine.registry import get
    from llm_inference_harness.sampling.enumeration import exact_distribution, max_difference
    from llm_inference_harness.sampling.lm import TableLM
    from llm_inference_harness.strategies.common import generator
    from llm_inference_harness.strategies.speculative import probability_table

    speculative = get("speculative", "standard").fn  # the standard rule, as registered

    def run(**kw):
        g = generator(0)
        target, draft = (TableLM(probability_table(vocab, order, 0.3, g)) for order in (2, 1))
        start = time.perf_counter()
        result = exact_distribution(speculative, target, draft, [0], gamma=gamma, T=T, **kw)
        return result, time.perf_counter() - start

    ray, cluster = _cluster(workers)
    try:
        for _ in range(repeats):
            alone, one = run(workers=1)
            forked, fork_s = run(workers=workers, parallel_after_runs=1)
            split, ray_s = run(workers=workers, parallel_after_runs=1, pool=RayPool)
            for what, result in (("forked", forked), ("ray", split)):
                assert max_difference(result.dist, alone.dist)[0] <= 1e-12, f"the {what} split changed the result"
            print(f"vocabulary {vocab}, gamma {gamma}, T {T}: {alone.runs:,} runs, {alone.states:,} round states; one "
                  f"process {one:.1f} s, {workers} forked workers {fork_s:.1f} s (x{one / fork_s:.2f}), {workers} Ray "
                  f"actors {ray_s:.1f} s (x{one / ray_s:.2f}; {_load()})")
    finally:
        ray.shutdown()
        cluster.shutdown()


def plan_estimate(paths: list[str], implementations: int, hosts: int, cores: int, overhead: float,
                  scale: float) -> None:
    import heapq
    import random

    from llm_inference_harness.engine.runner import Target
    from llm_inference_harness.engine.units import Durations, Shard, Unit, plan

    recorded = Durations.load(paths).recorded
    per_impl: dict[tuple[str, str], list[float]] = {}
    mutants = []
    for key, seconds in recorded.items():
        if key[0] == "check":
            per_impl.setdefault((key[1], key[2]), []).append(seconds * scale)
        else:
            mutants.append(seconds * scale)
    rng = random.Random(0)
    drawn = [per_impl[k] for k in rng.choices(sorted(per_impl), k=implementations)]
    times = [t + overhead for unit_times in drawn for t in unit_times] + [t + overhead for t in mutants]
    units = [Unit("all", Target("all", name=str(i)), "p") for i in range(len(times))]
    durations = Durations({u.key: t for u, t in zip(units, times, strict=True)}, source="plan")
    shard_walls = []
    for index in range(1, hosts + 1):
        free = [0.0] * cores
        for unit in plan(units, Shard(index, hosts), durations).units:
            heapq.heappush(free, heapq.heappop(free) + durations.expected(unit))
        shard_walls.append(max(free))
    free = [0.0] * (hosts * cores)
    for t in sorted(times, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + t)
    print(f"{implementations} implementations ({len(times) - len(mutants):,} check units) + {len(mutants)} mutants: "
          f"{sum(times):,.0f} s of units (x{scale:g} the recorded times, +{overhead:g} s each); {hosts} hosts x "
          f"{cores} cores: {hosts} shards {max(shard_walls):,.0f} s (mean shard {sum(shard_walls) / hosts:,.0f} s), "
          f"Ray {max(free):,.0f} s; the longest unit {max(times):,.0f} s")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m llm_inference_harness.engine.measure",
                                description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--repeats", type=int, default=2)
    e = sub.add_parser("enumeration")
    e.add_argument("--vocab", type=int, default=32)
    e.add_argument("--T", type=int, default=4)
    e.add_argument("--gamma", type=int, default=3)
    e.add_argument("--workers", type=int, default=2)
    e.add_argument("--repeats", type=int, default=2)
    pl = sub.add_parser("plan")
    pl.add_argument("--durations", action="append", required=True)
    pl.add_argument("--implementations", type=int, default=1000)
    pl.add_argument("--hosts", type=int, default=100)
    pl.add_argument("--cores", type=int, default=2)
    pl.add_argument("--overhead", type=float, default=0.1, help="seconds a unit costs beyond its property")
    pl.add_argument("--scale", type=float, default=1.0, help="times the recorded durations (another profile, "
                    "another load)")
    args = p.parse_args()
    if args.what == "overhead":
        overhead(args.repeats)
    elif args.what == "enumeration":
        enumeration(args.vocab, args.T, args.gamma, args.workers, args.repeats)
    else:
        plan_estimate(args.durations, args.implementations, args.hosts, args.cores, args.overhead, args.scale)


if __name__ == "__main__":
    main()
