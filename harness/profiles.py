"""Hypothesis profiles: dev (quick, random), ci (derandomized, reproducible), thorough (many examples).

Registered by the root conftest.py for pytest and by the CLI before it imports any property.
"""

from hypothesis import HealthCheck, Phase, settings

PROFILES = ("dev", "ci", "thorough")
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.differing_executors]


def register_profiles() -> None:
    settings.register_profile("dev", max_examples=20, deadline=None, suppress_health_check=_SLOW_OK)
    settings.register_profile(
        "ci", max_examples=30, deadline=None, derandomize=True, database=None, print_blob=True,
        suppress_health_check=_SLOW_OK,
    )
    settings.register_profile(
        "thorough", max_examples=400, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK,
        phases=list(Phase),
    )


def load(name: str) -> None:
    if name not in PROFILES:
        raise ValueError(f"--profile must be one of {', '.join(PROFILES)}, got {name!r}")
    register_profiles()
    settings.load_profile(name)
