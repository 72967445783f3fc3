"""guarded_call names every process-wide random generator a call moves (harness/engine/guard.py global_state): numpy's
global one is read in place rather than through np.random.get_state(), so each way of moving it is shown here."""

import random

import numpy as np
import pytest
import torch

from llm_inference_harness.engine.guard import ContractViolation, guarded_call

MOVES = {  # what the call does -> the generator the verdict must name
    "np.random.seed": (lambda: np.random.seed(1), "numpy global RNG"),
    "np.random.rand": (lambda: np.random.rand(), "numpy global RNG"),
    "one np.random.randn": (lambda: np.random.randn(), "numpy global RNG"),  # leaves a Box-Muller spare
    "np.random.shuffle": (lambda: np.random.shuffle([1, 2, 3]), "numpy global RNG"),
    "np.random.set_bit_generator": (lambda: np.random.set_bit_generator(np.random.PCG64(0)), "numpy global RNG"),
    "random.random": (lambda: random.random(), "python random RNG"),
    "torch.rand": (lambda: torch.rand(1), "torch global RNG"),
}


@pytest.fixture(autouse=True)
def generators_restored():
    bitgen, numpy_state = np.random.get_bit_generator(), np.random.get_state()
    python_state, torch_state = random.getstate(), torch.random.get_rng_state()
    yield
    np.random.set_bit_generator(bitgen)
    np.random.set_state(numpy_state)
    random.setstate(python_state)
    torch.random.set_rng_state(torch_state)


@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_call_that_moves_a_generator_is_named(move):
    call, named = MOVES[move]
    with pytest.raises(ContractViolation, match=f"changed global state: {named}"):
        guarded_call(lambda: call())


def test_a_call_that_moves_nothing_passes():
    assert guarded_call(lambda x: x + 1, 1) == 2
