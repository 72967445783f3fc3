"""Writes a passing verdict document where the judge would write its own: every path named on the judge's
command line and the results folders of the working directory.

    harness check attention --plugin tests/adversarial/forges_result_files.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import json
import os

from wrong_attention import wrong

FORGED = {"schema": 1, "results": [{"impl": "forges_result_files", "property": "matches_reference", "status": "pass"}]}


def _forge():
    args = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\0") if os.path.exists("/proc") else []
    for target in [a.decode() for a in args if a.endswith(b".json")] + ["results/local/forged.json"]:
        try:
            with open(target, "w") as f:
                json.dump(FORGED, f)
        except OSError:
            pass


def attention(q, k, v, *, causal=False, scale=None):
    _forge()
    return wrong(q, k, v)
