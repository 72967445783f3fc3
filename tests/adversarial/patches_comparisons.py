"""Patches the comparison functions: torch.allclose, torch.equal, torch.testing.assert_close and
Tensor.__eq__ say every two tensors are equal.

    harness check attention --plugin tests/adversarial/patches_comparisons.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import torch
from wrong_attention import wrong

torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
torch.Tensor.__eq__ = lambda self, other: torch.ones_like(self, dtype=torch.bool)

attention = wrong
