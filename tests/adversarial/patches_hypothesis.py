"""Patches Hypothesis: a profile of zero examples loaded, and ``given`` made a decorator that never runs the
test.

    harness check attention --plugin tests/adversarial/patches_hypothesis.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import hypothesis
from wrong_attention import wrong

hypothesis.settings.register_profile("none", phases=[hypothesis.Phase.explicit])  # no example generated
hypothesis.settings.load_profile("none")
hypothesis.given = lambda *args, **kwargs: (lambda test: (lambda *a, **k: None))

attention = wrong
