"""The Ray executor and the enumeration's Ray pool on a real local multi-node cluster (`ray.cluster_utils.Cluster`:
a head and two worker nodes of one CPU each, one declaring a GPU; every node on 127.0.0.1, as
/work/shared/notes/cluster.md's setting RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes it).

Units run where Ray puts them and come back with the verdicts a local run gives; a unit that needs a device runs
only on a node that declares it; a node removed mid-run costs its units a rerun elsewhere, none lost or counted
twice; a checking process killed from outside costs its unit a rerun; a unit whose checking process dies, or whose
worker dies, on every try gets a crashed verdict.  They need the [cluster] extra and start servers, so they run only
when asked: HARNESS_CLUSTER_TESTS=1, as the cluster step of .ci/run does (the README's test command needs no
server)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

if not os.environ.get("HARNESS_CLUSTER_TESTS"):
    pytest.skip("the cluster tests start Ray clusters: HARNESS_CLUSTER_TESTS=1 runs them (.ci/run's cluster step)",
                allow_module_level=True)
# Ray reads this when it is imported: every node of the test cluster, and this driver, on 127.0.0.1
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")

from llm_inference_harness.engine.enumeration_pool import RayPool  # noqa: E402 - after the skip: it needs Ray
from llm_inference_harness.engine.executors import Local, Ray  # noqa: E402
from llm_inference_harness.engine.runner import Progress, Target  # noqa: E402
from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY  # noqa: E402
from llm_inference_harness.engine.units import Job, check_units  # noqa: E402
from llm_inference_harness.impls.speculative.standard import speculative  # noqa: E402
from llm_inference_harness.sampling.enumeration import exact_distribution, max_difference  # noqa: E402
from llm_inference_harness.sampling.lm import TableLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).with_name("cluster_plugins.py")
MISBEHAVING = Path(__file__).with_name("misbehaving_plugins.py")
FAST = ["scores_1000_999_998_10", "rejects_bad_input", "empty_shapes_give_empty_output"]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = {"gpu": c.add_node(num_cpus=1, num_gpus=1), "plain": c.add_node(num_cpus=1)}
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


def _verdicts(results: dict) -> dict:
    return {key: [(v.impl, v.property, v.status, v.message, v.counterexample) for v in r.verdicts]
            for key, r in results.items()}


def test_a_unit_that_needs_a_device_runs_only_where_one_is_declared(cluster):
    """The implementations that declare only CUDA ask for a GPU: they run on the node declaring one (here, with
    no CUDA present, each property skips saying so -- the verdict a machine without the device gives)."""
    _, nodes = cluster
    from llm_inference_harness.engine.registry import impls

    needing = [Target("attention", name=i.name) for i in impls("attention") if "cpu" not in i.devices]
    units = check_units("attention", needing, FAST)
    assert needing and all(u.needs == ("cuda",) for u in units)
    executor = Ray()
    on_ray = executor.run(units, Job("ci"), Progress())
    assert {p["node"] for p in executor.placements.values()} == {nodes["gpu"].node_id}
    assert _verdicts(on_ray) == _verdicts(Local(1).run(units, Job("ci"), Progress()))


def test_a_unit_that_crashes_gets_the_verdict_it_gets_locally(cluster):
    """A checking process that segfaults: the same verdict as on this machine.  A plugin that kills the worker
    running its unit (here its checking process's parent): Ray retries it, and on the last try's death the
    unit is a crash, not a lost unit or a hung run."""
    crash = check_units("attention", [Target("attention", plugin=f"{MISBEHAVING}:crashes")], ["matches_reference"])
    assert _verdicts(Ray().run(crash, Job("ci"), Progress())) == _verdicts(Local(1).run(crash, Job("ci"), Progress()))
    killer = check_units("attention", [Target("attention", plugin=f"{PLUGINS}:kills_its_checker")],
                         ["matches_reference"])
    (result,) = Ray(max_retries=1).run(killer, Job("ci"), Progress()).values()
    (verdict,) = result.verdicts
    if os.geteuid() == 0:  # its process runs as a user of its own (harness/engine/confine.py): no signal reaches
        assert verdict.status == "FAIL" and "Operation not permitted" in verdict.message, verdict.message
        return
    assert verdict.status == "FAIL" and verdict.message.startswith(
        "crashed: the Ray worker running it died on each of 2 tries"), verdict.message


def _kill_a_checking_process(killed: list[int], settle_s: float = 1.0, within_s: float = 60.0) -> None:
    """SIGKILL the first checking process of a unit on this machine's cluster once it has run ``settle_s`` (the
    implementation loaded, a property under way): the process a Ray worker running `ray_unit` forked."""
    first_seen: dict[int, float] = {}
    end = time.monotonic() + within_s
    while not killed and time.monotonic() < end:
        for pid in _checking_processes():
            if time.monotonic() - first_seen.setdefault(pid, time.monotonic()) >= settle_s:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
        time.sleep(0.05)


def _checking_processes() -> list[int]:
    def title_and_parent(pid: int) -> tuple[str, int]:
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            return title, int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # gone meanwhile
            return "", 0

    def runs_unit(pid: int) -> bool:
        return title_and_parent(pid)[0].startswith("ray::ray_unit")

    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [p for p in pids if runs_unit(p) and runs_unit(ppid := title_and_parent(p)[1])
            and not runs_unit(title_and_parent(ppid)[1])]


def test_a_checking_process_killed_mid_unit_is_rerun_not_judged(cluster):
    """What a node going away can do (CI saw it once: a checking process dead, its worker alive long enough to
    report the death as the unit's verdict): a running unit's checking process is killed from outside.  The unit is
    rerun and gets the local run's verdict, not a crash the implementation never caused."""
    units = check_units("attention", [Target("attention", plugin=f"{PLUGINS}:slow_correct")], ["matches_reference"])
    killed: list[int] = []
    killer = threading.Thread(target=_kill_a_checking_process, args=(killed,), daemon=True)
    killer.start()
    on_ray = Ray().run(units, Job("ci"), Progress())
    killer.join()
    assert killed, "no checking process was found to kill: the test did not test"
    assert _verdicts(on_ray) == _verdicts(Local(1).run(units, Job("ci"), Progress()))


class RemoveANode(Progress):
    """Removes ``node`` from ``cluster`` once ``after`` verdicts are in, and notes the time."""

    def __init__(self, cluster, node, after: int) -> None:
        self.cluster, self.node, self.after, self.seen, self.removed_at = cluster, node, after, 0, None

    def finished(self, target, verdict) -> None:
        self.seen += 1
        if self.seen == self.after:
            self.cluster.remove_node(self.node)
            self.removed_at = time.monotonic()


def test_a_node_lost_mid_run_costs_reruns_not_units(cluster):
    """Six slow implementations x three properties, spread over three nodes; one node removed after a third of
    the units: every unit comes back once, with the verdicts a local run gives."""
    c, nodes = cluster
    targets = [Target("attention", plugin=f"{PLUGINS}:slow_correct")] + [
        Target("attention", name=n) for n in ("naive", "fa2_17x33", "fa1_24x40", "fa2_64x64", "reference")]
    units = check_units("attention", targets, FAST)
    executor = Ray()
    progress = RemoveANode(c, nodes["plain"], after=len(units) // 3)
    try:
        on_ray = executor.run(units, Job("ci"), progress)
    finally:
        nodes["plain"] = c.add_node(num_cpus=1)  # the other tests' cluster again
    assert progress.removed_at is not None
    assert sorted(on_ray) == sorted(u.key for u in units)
    assert _verdicts(on_ray) == _verdicts(Local(1).run(units, Job("ci"), Progress()))
    assert all(v.status != "FAIL" for r in on_ray.values() for v in r.verdicts)


def _harness(*args: str, log: Path) -> subprocess.Popen:
    with log.open("w") as sink:
        return subprocess.Popen([sys.executable, "-m", "llm_inference_harness", *args], cwd=ROOT, stdout=sink,
                                stderr=subprocess.STDOUT, text=True)


# The three attention properties that cost half of a whole check's time, left out: the test runs the check twice
# (on this machine, then on the cluster) within CI's 15 minutes
HEAVY = {"large_logits_stay_finite_and_correct", "long_keys_and_wide_heads", "key_value_permutation_invariance"}


def test_check_attention_on_the_cluster_gives_the_local_verdicts_and_survives_a_lost_node(cluster, tmp_path):
    """`harness check attention --executor ray` (every implementation, every property but HEAVY) from the command
    line, one of the three nodes removed once a third of the verdicts are in: the document's implementations and
    verdicts are the local run's, apart from times and where they ran, each unit counted once."""
    from llm_inference_harness.engine.registry import impls
    from llm_inference_harness.engine.runner import properties_of

    c, nodes = cluster
    props = [p.name for p in properties_of("attention") if p.name not in HEAVY]
    documents, units = {}, len(impls("attention")) * len(props)
    chosen = [arg for p in props for arg in ("--property", p)]
    for name, extra in (("local", []), ("ray", ["--executor", "ray", "--address", c.address])):
        out, log = tmp_path / f"{name}.json", tmp_path / f"{name}.log"
        proc = _harness("check", "attention", *chosen, "--jobs", "2", "--json", str(out), *extra, log=log)
        if name == "ray":
            while proc.poll() is None and log.read_text().count("[attention ") < units // 3:
                time.sleep(0.2)
            c.remove_node(nodes["plain"])
        try:
            proc.wait(timeout=1800)
        finally:
            if name == "ray":
                nodes["plain"] = c.add_node(num_cpus=1)
        assert out.is_file(), log.read_text()[-3000:]
        documents[name] = (proc.returncode, json.loads(out.read_text()))
    (local_code, local), (ray_code, on_ray) = documents["local"], documents["ray"]
    assert on_ray["implementations"] == local["implementations"]
    same = ("impl", "property", "status", "message", "counterexample", "reproduce")
    differ = [(v, w) for v, w in zip(on_ray["verdicts"], local["verdicts"], strict=True)
              if {k: v[k] for k in same} != {k: w[k] for k in same}]
    assert differ == [], f"{len(differ)} verdicts differ; the first (ray, local): {differ[0]}"
    assert ray_code == local_code == 0
    assert sum(on_ray["executor"]["units_per_node"].values()) == len(local["verdicts"])
    assert len(on_ray["executor"]["units_per_node"]) == 3, on_ray["executor"]


def _uniform(V: int) -> TableLM:
    return TableLM(torch.full((V,), 1.0 / V, dtype=torch.float64))


def broken_on_token_two(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    x = int(rng.categorical(target([prompt])[0, -1]))
    if x == 2:  # the judge runs x = 0 first and hands x = 1, 2 to the actors
        raise ValueError(f"broken_on_token_two: drew {x}")
    return [x]


@pytest.mark.parametrize("merge", [True, False])
def test_the_enumeration_split_over_ray_sums_to_the_same_distribution(cluster, merge):
    from llm_inference_harness.strategies.common import generator
    from llm_inference_harness.strategies.speculative import probability_table

    g = generator(0)
    target, draft = (TableLM(probability_table(4, order, 0.3, g)) for order in (2, 1))
    kw = dict(gamma=3, T=4, merge=merge)
    alone = exact_distribution(speculative, target, draft, [0], workers=1, **kw)
    split = exact_distribution(speculative, target, draft, [0], workers=3, parallel_after_runs=1, pool=RayPool, **kw)
    assert split.workers == 3 and set(split.dist) == set(alone.dist)
    assert max_difference(split.dist, alone.dist)[0] <= FLOAT64_IDENTITY
    assert (split.runs + split.settled, split.states) == (alone.runs + alone.settled, alone.states)


def test_a_samplers_error_in_an_actor_is_raised_with_its_traceback(cluster):
    with pytest.raises(ValueError, match="drew 2") as raised:
        exact_distribution(broken_on_token_two, _uniform(3), None, [0], gamma=1, T=1, workers=2,
                           parallel_after_runs=1, merge=False, pool=RayPool)
    assert "broken_on_token_two" in str(raised.value.__cause__), "the actor's traceback was lost"
