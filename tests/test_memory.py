"""The CPU memory meter (harness/engine/memory.py) that the materialization property and the benchmarks'
peak memory read.
"""

import torch

from llm_inference_harness.engine.memory import TensorMemory


def test_tensor_memory_counts_live_bytes():
    """The CPU memory meter behind the materialization property and the benchmark's peak memory: views and
    in-place results allocate nothing, a storage is released when its last tensor (a view included) dies."""
    x = torch.ones(300)
    with TensorMemory() as mem:
        a, b = torch.zeros(1000), torch.zeros(500)  # 4000 + 2000 bytes live: the peak
        view = b[10:20].view(2, 5)
        del a
        c = torch.zeros(200) + x[:200]  # a temporary of 800 bytes, then the result's 800
        x.add_(1)
    assert (mem.peak, mem.largest, mem.live) == (6000, 4000, 2800)
    del b
    assert mem.live == 2800, "b's storage is still held by its view"
    del view
    assert mem.live == 800 and c.numel() == 200
