"""The enumerator's worker processes (harness/sampling/enumeration.py): forking changes the order of summation only.

``parallel_after_runs=1`` forks after the first run, so that small drawn cases take the parallel path: the
pending branches of the first round state go to the workers, then whole round states, level by level.
"""

import multiprocessing

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY
from llm_inference_harness.impls.speculative.standard import speculative
from llm_inference_harness.sampling.enumeration import PARALLEL_AFTER_RUNS, exact_distribution, max_difference
from llm_inference_harness.sampling.lm import TableLM
from llm_inference_harness.strategies.speculative import speculative_cases

pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                                reason="no fork on this platform: the enumerator always runs in one process")


@given(case=speculative_cases(max_T=3), merge=st.booleans())
def test_workers_give_the_sequential_distribution(case, merge):
    """Two workers from the first run on: the same outputs, probabilities to FLOAT64_IDENTITY, round states
    and outcomes (run, or settled without a run: a worker confirms a last draw's pattern on its own) as one
    process; and a case of fewer runs than PARALLEL_AFTER_RUNS never forks by default."""
    target, draft = case.models()
    kw = dict(gamma=case.gamma, T=case.T, eos=case.eos, merge=merge)
    alone = exact_distribution(speculative, target, draft, list(case.prompt), workers=1, **kw)
    forked = exact_distribution(speculative, target, draft, list(case.prompt), workers=2, parallel_after_runs=1, **kw)
    assert set(forked.dist) == set(alone.dist), "the workers found other outputs than one process"
    err, where = max_difference(forked.dist, alone.dist)
    assert err <= FLOAT64_IDENTITY, f"P{where} differs by {err:.3g} between two workers and one process"
    assert (forked.runs + forked.settled, forked.states) == (alone.runs + alone.settled, alone.states)
    # a round state with more than one branch leaves branches pending after its first run: the fork happens
    assert forked.workers == (2 if alone.runs > alone.states else 1)
    if alone.runs < PARALLEL_AFTER_RUNS:  # every drawn case: run by run at V 6, gamma 4, T 3 is ~2,400 runs
        default = exact_distribution(speculative, target, draft, list(case.prompt), workers=2, **kw)
        assert default.workers == 1, f"{alone.runs} runs, below PARALLEL_AFTER_RUNS, forked by default"


def _uniform(V: int) -> TableLM:
    return TableLM(torch.full((V,), 1.0 / V, dtype=torch.float64))


def broken_on_token_two(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    x = int(rng.categorical(target([prompt])[0, -1]))
    if x == 2:  # the parent runs x = 0 first and hands x = 1, 2 to the workers
        raise ValueError(f"broken_on_token_two: drew {x}")
    return [x]


def test_an_error_in_a_worker_is_raised_with_its_traceback():
    """Run by run: merged, the outcome 2 of a last draw would be settled without a run."""
    with pytest.raises(ValueError, match="drew 2") as raised:
        exact_distribution(broken_on_token_two, _uniform(3), None, [0], gamma=1, T=1, workers=2, parallel_after_runs=1,
                           merge=False)
    assert "broken_on_token_two" in str(raised.value.__cause__), "the worker's traceback was lost"


def _enumerate_in(queue) -> None:
    result = exact_distribution(speculative, _uniform(3), _uniform(3), [0], gamma=2, T=2, workers=2,
                                parallel_after_runs=1)
    queue.put((result.workers, result.dist))


def test_a_daemonic_process_enumerates_without_forking():
    """`harness check` runs each implementation in a daemonic child, which may not fork: the enumeration
    stays in that process instead of failing with "daemonic processes are not allowed to have children"."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_enumerate_in, args=(queue,), daemon=True)
    child.start()
    workers, dist = queue.get(timeout=60)
    child.join(timeout=60)
    alone = exact_distribution(speculative, _uniform(3), _uniform(3), [0], gamma=2, T=2, workers=1)
    assert workers == 1 and child.exitcode == 0
    assert max_difference(dist, alone.dist)[0] <= FLOAT64_IDENTITY


def test_rejects_bad_workers():
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="workers"):
            exact_distribution(speculative, _uniform(3), _uniform(3), [0], gamma=1, T=1, workers=bad)
