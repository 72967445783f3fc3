"""Where units run: this machine's forked children (``local``, the default: no server), or a Ray cluster (``ray``).

Either way a unit is judged by `llm_inference_harness.engine.runner.check` /
`llm_inference_harness.engine.runner.kill_mutants` for its one target, in a checking process of its own
(harness/engine/isolation.py) on whichever machine runs it: the executor decides only where, never how.  Both return a
result per unit (`llm_inference_harness.engine.units.Unit.key`).

``local`` groups a shard's units by implementation and hands each group to the runner at once, ``jobs``
implementations at a time, as an unsharded run does.

``ray`` submits a task per unit (`ray_unit`), spread over the cluster's nodes, one CPU each, the longest expected first
(recorded durations, `llm_inference_harness.engine.units.Durations`: the run's tail is then short units).  A unit whose
implementation declares devices without the CPU asks for them as Ray resources (``cuda``: a GPU; another device: a
custom resource of its name), so it runs only on a node that declares them; where no node does, it runs anywhere and
gets the verdict a machine without that device gives (its properties skip, saying so).  Ray retries a unit whose worker
or node died (``max_retries``): a node lost mid-run costs its units a rerun elsewhere, each unit's result is taken once.
A unit whose checking process died without reporting is rerun too (`CheckerDied`): a node going away kills checking
processes while their worker may live long enough to report the death, and that death is not the implementation's
verdict.  A unit whose worker or checking process died on every try gets ``crashed:`` verdicts, as a checking process
that dies locally does.  Results stream back unit by unit through the progress callbacks.
"""

from __future__ import annotations

import os
import socket
import time

from llm_inference_harness.engine import exampledb, runner
from llm_inference_harness.engine.isolation import CHECKER_DIED
from llm_inference_harness.engine.units import Durations, Job, Unit, result_from_dict, result_to_dict, split

POLL_S = 0.05
MAX_RETRIES = 3  # a unit's reruns after its worker or node died: a lost node's units go elsewhere
FORWARDED_ENV = ("TRITON_INTERPRET",)  # besides every HARNESS_* variable: the settings a checking process reads


class Local:
    """Forked checking processes on this machine, ``jobs`` at a time."""

    name = "local"

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs

    def run(self, units: list[Unit], job: Job, progress: runner.Progress) -> dict[tuple[str, ...], runner.ImplResult]:
        results = {}
        for technique, kind, group in _groups(units, one_target=exampledb.enabled()):
            targets = list(dict.fromkeys(u.target for u in group))
            with exampledb.scoped(targets[0] if len(targets) == 1 else None):
                if kind == "check":
                    props = list(dict.fromkeys(u.prop for u in group))
                    found = runner.check(technique, targets, profile=job.profile, properties=props, jobs=self.jobs,
                                         progress=progress, blob=job.blob, shrink=job.shrink)
                else:
                    found = runner.kill_mutants(technique, profile=job.profile, jobs=self.jobs, progress=progress,
                                                all_properties=job.all_properties, names=[t.name for t in targets])
            for result in found:
                results.update(split(result, [u for u in group if u.target == result.target]))
        return results


def _groups(units: list[Unit], one_target: bool) -> list[tuple[str, str, list[Unit]]]:
    """(technique, kind, units) to hand the runner at once: the targets of a technique that share the same
    properties (or, with ``one_target``, each target alone), in order."""
    props: dict[runner.Target, list[str | None]] = {}
    for u in units:
        props.setdefault(u.target, []).append(u.prop)
    groups: dict[tuple, list[Unit]] = {}
    for u in units:
        key = (u.technique, u.kind, u.target if one_target else tuple(props[u.target]))
        groups.setdefault(key, []).append(u)
    return [(key[0], key[1], group) for key, group in groups.items()]


# --- Ray ---------------------------------------------------------------------------------------------------------
def harness_env() -> dict[str, str]:
    """The environment a unit's node needs from this one: every HARNESS_* setting and FORWARDED_ENV."""
    return {k: v for k, v in os.environ.items() if k.startswith("HARNESS_") or k in FORWARDED_ENV}


class CheckerDied(Exception):
    """Raised by `ray_unit` when the unit's checking process died without reporting, so that Ray reruns it; carries
    what `ray_unit` would have returned, the unit's result on its last try."""

    def __init__(self, out: dict) -> None:
        super().__init__(out["result"]["stopped"])
        self.out = out


_profile_loaded: str | None = None  # in a Ray worker: the profile its property modules were imported under


def ray_unit(unit: Unit, job: Job) -> dict:
    """What a Ray worker runs for a unit: the runner, on this node, for the unit's one target; its result as
    plain data with where and at which commit it ran."""
    global _profile_loaded
    from llm_inference_harness.engine import profiles, provenance

    if _profile_loaded not in (None, job.profile):  # a property's settings are read when its module is imported
        raise RuntimeError(f"this worker imported the properties under profile {_profile_loaded}, not {job.profile}")
    profiles.load(job.profile)
    _profile_loaded = job.profile
    from llm_inference_harness.engine.registry import impls

    impls(unit.technique, mutants=None)  # the registry, loaded here once: each unit's checking process forks with it
    start = time.perf_counter()
    with exampledb.scoped(unit.target):
        if unit.kind == "check":
            found = runner.check(unit.technique, [unit.target], profile=job.profile, properties=[unit.prop], jobs=1,
                                 blob=job.blob, shrink=job.shrink)
        else:
            found = runner.kill_mutants(unit.technique, profile=job.profile, jobs=1, all_properties=job.all_properties,
                                        names=[unit.target.name])
    import ray

    out = {"result": result_to_dict(found[0]), "host": socket.gethostname(), "pid": os.getpid(),
           "node": ray.get_runtime_context().get_node_id(), "commit": provenance.commit(),
           "seconds": time.perf_counter() - start}
    if found[0].stopped.startswith(CHECKER_DIED):
        raise CheckerDied(out)
    return out


class Ray:
    """Units as Ray tasks on the cluster at ``address`` (None: Ray's own choice, RAY_ADDRESS or a new local
    instance); a session already connected (``ray.init`` called before) is used as it is."""

    name = "ray"

    def __init__(self, address: str | None = None, max_retries: int = MAX_RETRIES,
                 durations: Durations | None = None) -> None:
        self.address, self.max_retries, self.durations = address, max_retries, durations or Durations()
        self.placements: dict[tuple[str, ...], dict] = {}  # unit key -> host, node, pid, seconds

    def connect(self):
        """Ray, connected; ValueError saying why not (Ray not installed, no cluster at the address)."""
        try:
            import ray
        except ImportError:
            raise ValueError("--executor ray needs Ray: pip install 'llm-inference-harness[cluster]'") from None
        if not ray.is_initialized():
            _reachable(self.address)
            try:
                ray.init(address=self.address, log_to_driver=False, include_dashboard=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = self.address or "a Ray cluster"
                raise ValueError(f"--executor ray: cannot connect to {where}: {exc}") from None
        return ray

    def run(self, units: list[Unit], job: Job, progress: runner.Progress) -> dict[tuple[str, ...], runner.ImplResult]:
        ray = self.connect()
        from llm_inference_harness.engine import provenance

        task = ray.remote(ray_unit)
        declared = ray.cluster_resources()
        # Ray keeps a pool of workers per runtime environment: naming the profile in it gives each profile
        # workers of its own (a property's settings are read when its module is imported)
        env = {"env_vars": {**harness_env(), "HARNESS_UNIT_PROFILE": job.profile}}
        refs = {}
        for unit in sorted(units, key=self.durations.expected, reverse=True):
            resources, missing = _resources(unit.needs, declared)
            if missing:
                progress.note(unit.target, f"no node declares {', '.join(missing)}: runs where they are absent")
            refs[task.options(num_cpus=1, max_retries=self.max_retries, retry_exceptions=[CheckerDied],
                              scheduling_strategy="SPREAD", runtime_env=env, **resources).remote(unit, job)] = unit
        results: dict[tuple[str, ...], runner.ImplResult] = {}
        loaded: set[runner.Target] = set()
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
                progress.tick()
                for ref in done:
                    unit = refs.pop(ref)
                    result = self._collect(ray, ref, unit, job, provenance.commit())
                    if unit.key in results:
                        raise AssertionError(f"unit {unit.key} came back twice")
                    results[unit.key] = result
                    if unit.target not in loaded:
                        loaded.add(unit.target)
                        progress.loaded(unit.target, result.info)
                    for verdict in result.verdicts:
                        progress.finished(unit.target, verdict)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return results

    def _collect(self, ray, ref, unit: Unit, job: Job, commit: str) -> runner.ImplResult:
        try:
            out = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            if not isinstance(exc.cause, CheckerDied):  # the harness itself failed on the node
                return failed(unit, job, f"error: the unit failed on its node: {_last_line(exc)}", str(exc)[-2000:])
            out = exc.cause.out  # its checking process died on every try: the verdict a local run gives
        except ray.exceptions.RayError as exc:  # its worker or node died on every try
            return failed(unit, job, f"crashed: the Ray worker running it died on each of {self.max_retries + 1} "
                                     f"tries ({type(exc).__name__}: {_last_line(exc)})")
        self.placements[unit.key] = {k: out[k] for k in ("host", "node", "pid", "seconds")}
        if out["commit"] != commit:
            return failed(unit, job, f"error: the node {out['host']} runs commit {out['commit']}, this run {commit}: "
                                     "every node must run the driver's commit")
        return result_from_dict(out["result"])


def _reachable(address: str | None) -> None:
    """A HOST:PORT address that nothing listens on is an error at once (Ray itself retries it for minutes)."""
    host, sep, port = (address or "").rpartition(":")
    if not sep or not port.isdigit() or "/" in host:  # "auto", ray://..., none: Ray's own
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as exc:
        raise ValueError(f"--executor ray: nothing answers at {address} ({exc}); expected a Ray head's HOST:PORT "
                         "(`ray start --head` prints it)") from None


def _resources(needs: tuple[str, ...], declared: dict) -> tuple[dict, list[str]]:
    """Ray options asking for ``needs`` (cuda: a GPU; another device: the custom resource of its name), and the
    devices no node declares (asked for, they would wait forever)."""
    resources, missing = {}, []
    for device in needs:
        name = "GPU" if device == "cuda" else device
        if declared.get(name, 0) < 1:
            missing.append(device)
        elif name == "GPU":
            resources["num_gpus"] = 1
        else:
            resources.setdefault("resources", {})[name] = 1
    return resources, missing


def failed(unit: Unit, job: Job, why: str, output: str = "") -> runner.ImplResult:
    """A unit that never reported: its first property failed saying why, the others not run (as
    `llm_inference_harness.engine.runner` reports a checking process that stopped)."""
    from llm_inference_harness.engine.runner import properties_of, reproduce_command

    props = [unit.prop] if unit.prop is not None else [p.name for p in properties_of(unit.technique)]
    label = unit.target.name or unit.target.label
    verdicts = [runner.Verdict(label, p, "FAIL", output=output if i == 0 else "",
                               message=why if i == 0 else f"not run: the unit stopped ({why.split(':')[0]})",
                               reproduce=reproduce_command(unit.technique, label, p, job.profile, unit.target.plugin))
                for i, p in enumerate(props)]
    return runner.ImplResult(unit.target, _declared(unit), verdicts, stopped=why)


def _declared(unit: Unit) -> dict:
    """What the registry declares of a registered target (a mutant's killers and bug: its status needs them);
    nothing for a plugin, which only its checking process imports."""
    from llm_inference_harness.engine.registry import get

    if unit.target.name is None:
        return {}
    impl = get(unit.technique, unit.target.name)
    return {"name": impl.name, "technique": impl.technique, "mutant": impl.mutant, "exact": impl.exact,
            "killed_by": impl.killed_by, "bug": impl.bug, "devices": impl.devices, "dtypes": impl.dtypes,
            "caps": impl.caps.declared(), "source": impl.source, "cite": impl.cite, "unavailable": impl.unavailable}


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else type(exc).__name__
