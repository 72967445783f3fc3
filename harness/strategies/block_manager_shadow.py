"""The caller's side of a block-manager program (contract: harness/contracts/block_manager.py): the storage that
plays the model, and what a prefix's KV is.

The KV the storage writes for token i of a sequence is (the interned id of) the sequence's whole prefix
tokens[:i+1], so a block reused under the wrong prefix reads back wrong, whichever block before it matches.
"""

from __future__ import annotations

from llm_inference_harness.contracts.block_manager import NullStorage
from llm_inference_harness.engine.guard import ContractViolation
from llm_inference_harness.strategies.block_manager import PoolGeometry


class Prefixes:
    """Token prefixes interned as ints (a trie): the KV of token i is the id of tokens[:i+1], so a slot compares in
    O(1) where the tuple of a 2,000-token prefix costs O(L) to build and compare."""

    def __init__(self):
        self.ids: dict[tuple[int, int], int] = {}
        self.nodes: list[tuple[int, int]] = []  # id -> (parent id, token); the empty prefix is -1

    def child(self, parent: int, token: int) -> int:
        if (parent, token) not in self.ids:
            self.ids[parent, token] = len(self.nodes)
            self.nodes.append((parent, token))
        return self.ids[parent, token]

    def of(self, tokens) -> list[int]:
        """The ids of every prefix of ``tokens``: ids[i] is the id of tokens[:i+1]."""
        ids: list[int] = []
        for t in tokens:
            ids.append(self.child(ids[-1] if ids else -1, t))
        return ids

    def tokens(self, node) -> list[int]:
        out = []
        while node is not None and node >= 0:
            node, token = self.nodes[node]
            out.append(token)
        return out[::-1]

    def shown(self, node) -> str:
        tokens = self.tokens(node) if node is not None else None
        return repr(tokens) if tokens is None or len(tokens) <= 12 else f"[..., {str(tokens[-8:])[1:]} ({len(tokens)})"


class ShadowStorage:
    """The caller's KV storage: slots hold the prefix id each token's KV was computed from; None = never written.
    ``trace`` keeps every call, in order (the replay compares it); ``overwritten`` the prefix ids of full blocks a
    write, copy or swap-in replaced (candidate evictions); ``violations`` the writes into a block whose reference
    count (``ref_count``, set by the caller) exceeds one.  A sink (harness/engine/wire.py): a manager in the
    implementation's process has its storage calls replayed here when its call returns, so a write's block count
    is read after the call that made it (a write into a shared block leaves it shared: the same finding)."""

    harness_sink = True

    def __init__(self, geometry: PoolGeometry, kv_of):
        B = geometry.block_size
        self.gpu = [[None] * B for _ in range(geometry.num_blocks)]
        self.cpu = [[None] * B for _ in range(geometry.num_cpu_blocks)]
        self.kv_of, self.ref_count, self.violations = kv_of, None, []
        self.writes = 0  # token KVs computed so far: allocate must compute exactly those it did not find cached
        self.trace: list[tuple] = []
        self.overwritten: set[int] = set()

    def _into(self, pool, block, what):
        if not (isinstance(block, int) and 0 <= block < len(pool)):
            raise ContractViolation(f"{what}: block {block!r} is outside the pool of {len(pool)}")
        if pool is self.gpu:
            if self.ref_count(block) > 1:
                self.violations.append(f"{what} into block {block} whose reference count is {self.ref_count(block)}")
            if None not in pool[block]:
                self.overwritten.add(pool[block][-1])
        return pool[block]

    def write(self, block, offset, seq_id, position):
        self.trace.append(("write", block, offset, seq_id, position))
        self._into(self.gpu, block, "write")[offset] = self.kv_of(seq_id, position)
        self.writes += 1

    def copy(self, src, dst):
        self.trace.append(("copy", src, dst))
        self._into(self.gpu, dst, "copy")[:] = self.gpu[src]

    def swap_out(self, gpu_block, cpu_block):
        self.trace.append(("swap_out", gpu_block, cpu_block))
        self._into(self.cpu, cpu_block, "swap_out")[:] = self.gpu[gpu_block]

    def swap_in(self, cpu_block, gpu_block):
        self.trace.append(("swap_in", cpu_block, gpu_block))
        self._into(self.gpu, gpu_block, "swap_in")[:] = self.cpu[cpu_block]


class RecordingStorage(NullStorage):
    """What a fresh manager does with the data, for the replay: every call, as ShadowStorage records it."""

    def __init__(self):
        self.trace: list[tuple] = []

    def write(self, block, offset, seq_id, position):
        self.trace.append(("write", block, offset, seq_id, position))

    def copy(self, src, dst):
        self.trace.append(("copy", src, dst))

    def swap_out(self, gpu_block, cpu_block):
        self.trace.append(("swap_out", gpu_block, cpu_block))

    def swap_in(self, cpu_block, gpu_block):
        self.trace.append(("swap_in", cpu_block, gpu_block))
