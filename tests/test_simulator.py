"""Properties of the serving simulator (harness/analytic/simulator): conservation laws of continuous batching
under each memory policy, on small seeded workloads, and the ordering of the policies it exists to show."""

from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.analytic.simulator.engine import Paged, Request, oracle, reserve_max, simulate
from llm_inference_harness.analytic.simulator.report import run_scenario
from llm_inference_harness.analytic.simulator.workload import SCENARIOS

MAX_OUTPUT = 24


@st.composite
def workloads(draw) -> tuple[list[Request], int]:
    """Requests and a budget that fits the largest one under every policy, but usually not all at once."""
    reqs = draw(st.lists(st.tuples(st.integers(1, 40), st.integers(1, MAX_OUTPUT)), min_size=1, max_size=12))
    requests = [Request(i, p, o) for i, (p, o) in enumerate(reqs)]
    biggest = max(q.prompt for q in requests) + MAX_OUTPUT
    return requests, draw(st.integers(biggest, 3 * biggest)) // 16 * 16 + 16


def all_policies(budget: int, block_size: int = 4):
    return [reserve_max(budget, MAX_OUTPUT), oracle(budget), Paged(budget, block_size),
            Paged(budget, block_size, swap=True, cpu_budget=budget // 2), Paged(budget, 1, impl="simple")]


@given(workload=workloads())
def test_every_request_generates_its_tokens_within_budget(workload):
    """Every token is generated exactly once; allocated slots never exceed the budget; each policy's
    waste has its documented shape (oracle: no internal fragmentation; paged: no external, block 1: no waste)."""
    requests, budget = workload
    for policy in all_policies(budget):
        trace = []
        m = simulate(requests, policy, trace=trace)
        assert m.generated == sum(q.output for q in requests), f"{policy.name}: {m.generated} tokens generated"
        assert m.steps >= max(q.output for q in requests)
        for step, (stored, reserved, internal, external, batch, allocated) in enumerate(trace):
            assert stored + reserved + internal == allocated <= budget, f"{policy.name} step {step}: {trace[step]}"
            assert batch >= 1 and min(reserved, internal, external) >= 0
            if policy.name == "oracle":
                assert internal == 0
            if policy.paged:
                assert external == 0
            if policy.paged and policy.B == 1:
                assert reserved + internal == 0
        if not policy.paged:
            assert m.preemptions == 0, f"{policy.name} preempted although it reserves up front"


@given(workload=workloads())
def test_with_room_for_everyone_all_run_at_once(workload):
    """A budget that holds every request's maximum reservation: no queueing, no preemption, and the run
    takes exactly as many steps as the longest output."""
    requests, _ = workload
    budget = sum(q.prompt + MAX_OUTPUT for q in requests)
    for policy in all_policies(budget, block_size=1):
        m = simulate(requests, policy)
        assert (m.steps, m.preemptions, m.queued.steps) == (max(q.output for q in requests), 0, 0), policy.name


def test_preemption_by_recompute_and_by_swap():
    """Two requests that outgrow a small pool: the later one is preempted, and still finishes its tokens."""
    requests = [Request(0, 8, 20), Request(1, 8, 20)]
    for policy, swaps in ((Paged(32, 4, watermark=0), 0), (Paged(32, 4, swap=True, cpu_budget=32, watermark=0), 1)):
        m = simulate(requests, policy)
        assert m.preemptions >= 1 and m.generated == 40, m
        assert (m.swaps >= 1) == bool(swaps) and (m.recomputed_tokens > 0) == (not swaps), m


def test_scenarios_are_seeded():
    for sc in SCENARIOS.values():
        assert sc.requests() == sc.requests()
        assert all(1 <= q.output <= sc.max_output for q in sc.requests())


def test_scenario_a_policies_order_as_the_paper_says():
    """Scenario (a): utilization and batch grow from reserve-max to oracle to paged; paged waste < 4%."""
    reserve, orc, paged, _ = run_scenario("a")
    assert reserve.share("stored") < orc.share("stored") < paged.share("stored")
    assert reserve.mean("batch") < orc.mean("batch") < paged.mean("batch")
    assert paged.share("reserved_unused") + paged.share("internal") < 0.04  # vLLM paper, Sec. 6: under 4%
