"""This project's own pytest runs: Hypothesis profiles by their plain names, one thread per xdist worker.

Choose a profile with ``--hypothesis-profile dev|ci|thorough`` (default: dev, or ci when CI is set).  A test
taking ``impl`` is parametrized over the registry by the harness's pytest plugin (harness/engine/pytest_plugin.py,
loaded through its ``pytest11`` entry point); where a property does not apply (a dtype or device not declared,
an asymmetric quantizer for the absmax round trip...) the case is a visible skip with the reason, as
`harness check` reports it (`pytest -rs` lists them).  Mutants are exercised by tests/test_mutants.py.
"""

import os

import torch

if not torch.cuda.is_available():
    # Triton kernels (the [test] extra installs Triton) run under its CPU interpreter here, at the
    # small sizes they declare; on a GPU machine they run natively.  Set before any impl is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")
import pytest
from hypothesis import settings

from llm_inference_harness.engine.profiles import fixed_constants, register_profiles

register_profiles()
fixed_constants()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """This project's own implementations are judged inside the test process, as `--harness-trusted-in-process`
    does: they are the code we trust, and the boundary costs this 2-core CI about 3 of its 15 minutes.  The judge's
    isolation is tested on its own: every technique's implementations get the same verdicts both ways
    (tests/test_boundary.py), every example plugin passes `harness check` isolated through every law of its
    technique (tests/test_docs.py), and every trick of tests/adversarial/ is caught (tests/test_adversarial.py).
    HARNESS_SUITE_ISOLATED=1 runs the whole suite isolated, as another project's pytest session runs it."""
    if os.environ.get("HARNESS_SUITE_ISOLATED") != "1":
        config.option.harness_trusted_in_process = True
settings.load_profile("ci" if os.environ.get("CI") else "dev")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each xdist worker gets one intra-op thread: two workers x two OpenMP threads on two cores
    # spin-wait on each other (a 0.2 s call took 8 s that way).  The processes a test starts (`harness`,
    # the wheel's pytest, the docs' blocks) inherit one thread too: an example plugin's `check --jobs 1` took
    # 7.6 CPU seconds with two threads beside the other worker, 4.5 with one.
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _hypothesis_profile_kept():
    """A test that runs a CLI command in this process loads the command's profile (`profiles.load`): the tests after
    it in the same worker would draw under that profile (after `harness mutants --profile dev`, a derandomized
    property drew dev's random examples and a mutant survived its declared killer)."""
    name = settings.get_current_profile_name()
    yield
    if settings.get_current_profile_name() != name:
        settings.load_profile(name)
