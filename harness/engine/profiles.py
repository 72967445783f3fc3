"""Hypothesis profiles: dev (quick, random), ci (derandomized, reproducible), thorough (many examples).

Registered by this project's conftest.py for its own pytest runs (``--hypothesis-profile ci``), by the CLI
before it imports any property, and under ``harness-`` names by the pytest plugin in another project's
session (which may have profiles of its own called ci or dev).

ci draws the same examples for the same command: Hypothesis (6.131+) also draws, now and then, a constant found in
the source of the "local" modules imported so far, so one test run alone would draw other examples than the whole
suite, each pytest-xdist worker its own, and an isolated judge (which imports no implementation) others than the
in-process one.  `fixed_constants` turns that pool off, for this project's suite (conftest.py) and for the CLI
(`load`); another project's session running the properties through the pytest plugin keeps its own pool.  A
failure's printed blob (``--reproduce``) replays it exactly either way.
"""

from hypothesis import HealthCheck, Phase, settings

PROFILES = ("dev", "ci", "thorough")
_SLOW_OK = [
    HealthCheck.too_slow,  # one example is a model's generation or a kernel on thousands of tokens: seconds is normal
    HealthCheck.data_too_large,  # a state machine's program of tens of steps, each drawing a sequence of tokens
]


def register_profiles(prefix: str = "") -> None:
    settings.register_profile(f"{prefix}dev", max_examples=20, deadline=None, suppress_health_check=_SLOW_OK)
    settings.register_profile(
        f"{prefix}ci", max_examples=30, deadline=None, derandomize=True, database=None, print_blob=True,
        suppress_health_check=_SLOW_OK,
    )
    settings.register_profile(
        f"{prefix}thorough", max_examples=400, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK,
        phases=list(Phase),
    )


def fixed_constants() -> None:
    """Hypothesis's pool of constants from the local modules imported so far, empty: each xdist worker imports its
    own set, so a derandomized property drew other examples in each (a mutant killed in one run survived the next),
    and so did an isolated judge and an in-process one (a block-manager machine ran 2,364 swap_outs in one, ~570 in
    the other).  No public setting turns the pool off (Hypothesis 6.170); the constants Hypothesis ships (0, 1, -1,
    float edges) stay."""
    from hypothesis.internal.conjecture import providers

    providers._get_local_constants = lambda: providers.Constants()


def load(name: str, prefix: str = "") -> None:
    """Load profile ``name`` (registered under ``prefix``); without a prefix (the CLI), with `fixed_constants`."""
    if name not in PROFILES:
        raise ValueError(f"--profile must be one of {', '.join(PROFILES)}, got {name!r}")
    if not prefix:
        fixed_constants()
    register_profiles(prefix)
    from llm_inference_harness.engine.exampledb import from_environment

    shared = from_environment()  # a Redis example database, where HARNESS_EXAMPLE_DB names one
    if shared is not None:
        settings.register_profile(f"{prefix}{name}", settings.get_profile(f"{prefix}{name}"), database=shared)
    settings.load_profile(f"{prefix}{name}")
