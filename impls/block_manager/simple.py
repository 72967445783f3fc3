"""A straightforward block manager: a free stack, an LRU dict of evictable cached blocks, a hash dict.

Each sequence owns a block table; block i holds tokens [i*B, (i+1)*B).  A block's reference count is
the number of block-table entries pointing at it; a shared last block is copied before it is written
(copy-on-write), full blocks are entered in the prefix cache under a hash chained with the previous
block's hash, and a cached block whose count reaches zero stays readable until evicted, least recently
used first.  Invariant: free stack + evictable + {blocks with count > 0} partition the pool.
Kwon et al. 2023, "Efficient Memory Management for LLM Serving with PagedAttention", Sec. 4.2-4.5.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from llm_inference_harness.contracts.block_manager import (
    OutOfBlocks,
    check_block,
    check_geometry,
    check_token,
    check_tokens,
)
from llm_inference_harness.engine.registry import register


@dataclass
class Seq:
    tokens: list[int]
    table: list[int]
    hashes: list[int] = field(default_factory=list)  # chained hashes of the full blocks
    swapped: bool = False


class SimpleBlockManager:
    def __init__(self, num_blocks, block_size, storage, *, num_cpu_blocks=0):
        check_geometry(num_blocks, block_size, num_cpu_blocks)
        self.B, self.num_blocks, self.storage = block_size, num_blocks, storage
        self.ref = [0] * num_blocks
        self.free_stack = list(range(num_blocks - 1, -1, -1))  # never cached (or evicted) blocks
        self.evictable: OrderedDict[int, int] = OrderedDict()  # block -> hash, least recently used first
        self.cache: dict[int, int] = {}  # chained hash -> block
        self.block_hash: dict[int, int] = {}  # block -> its hash, for blocks the cache points at
        self.cpu_free = list(range(num_cpu_blocks - 1, -1, -1))
        self.seqs: dict[int, Seq] = {}

    # ---- queries
    def block_table(self, seq_id):
        return list(self._seq(seq_id).table)

    def is_swapped(self, seq_id):
        return self._seq(seq_id).swapped

    def num_tokens(self, seq_id):
        return len(self._seq(seq_id).tokens)

    def ref_count(self, block):
        return self.ref[check_block(block, len(self.ref))]

    def num_free_blocks(self):
        return len(self.free_stack) + len(self.evictable)

    def num_free_cpu_blocks(self):
        return len(self.cpu_free)

    def lookup_prefix(self, tokens):
        return self.B * len(self._prefix_hits(self._chain(check_tokens(tokens))))

    # ---- lifecycle
    def allocate(self, seq_id, tokens):
        tokens = check_tokens(tokens)
        if seq_id in self.seqs:
            raise ValueError(f"allocate: seq_id {seq_id!r} is already allocated")
        hashes = self._chain(tokens)
        hits = self._prefix_hits(hashes)
        n_blocks = -(-len(tokens) // self.B)
        if n_blocks - len(hits) + sum(self.ref[b] == 0 for b in hits) > self.num_free_blocks():
            raise OutOfBlocks(f"allocate: {n_blocks} blocks needed, {self.num_free_blocks()} free")
        for b in hits:
            self._take(b)
        seq = Seq(list(tokens), hits + [self._new_block() for _ in range(n_blocks - len(hits))])
        self.seqs[seq_id] = seq
        cached = len(hits) * self.B
        for pos in range(cached, len(tokens)):
            self._write(seq_id, seq, pos)
        for i, h in enumerate(hashes):
            self._register(seq, i, h)
        return cached

    def append(self, seq_id, token):
        seq, token = self._resident(seq_id, "append"), check_token(token)
        n = len(seq.tokens)
        new_block = n % self.B == 0
        if (new_block or self.ref[seq.table[-1]] > 1) and self.num_free_blocks() == 0:
            raise OutOfBlocks(f"append: sequence {seq_id} needs a block and none is free")
        if new_block:
            seq.table.append(self._new_block())
        else:
            self._make_last_writable(seq)
        seq.tokens.append(token)
        self._write(seq_id, seq, n)
        if (n + 1) % self.B == 0:
            self._register(seq, n // self.B, self._hash(seq.hashes[-1] if seq.hashes else None, seq.tokens[-self.B:]))

    def fork(self, parent_id, child_id):
        parent = self._resident(parent_id, "fork")
        if child_id in self.seqs:
            raise ValueError(f"fork: child_id {child_id!r} is already allocated")
        for b in parent.table:
            self.ref[b] += 1
        self.seqs[child_id] = Seq(list(parent.tokens), list(parent.table), list(parent.hashes))

    def free(self, seq_id):
        seq = self._seq(seq_id)
        if seq.swapped:
            self.cpu_free.extend(reversed(seq.table))
        else:
            self._release_all(seq.table)
        del self.seqs[seq_id]

    def swap_out(self, seq_id):
        seq = self._resident(seq_id, "swap_out")
        if len(seq.table) > len(self.cpu_free):
            raise OutOfBlocks(f"swap_out: {len(seq.table)} CPU blocks needed, {len(self.cpu_free)} free")
        cpu = [self.cpu_free.pop() for _ in seq.table]
        for g, c in zip(seq.table, cpu, strict=True):
            self.storage.swap_out(g, c)
        self._release_all(seq.table)
        seq.table, seq.swapped = cpu, True

    def swap_in(self, seq_id):
        seq = self._seq(seq_id)
        if not seq.swapped:
            raise ValueError(f"swap_in: seq_id {seq_id!r} is not swapped out")
        if len(seq.table) > self.num_free_blocks():
            raise OutOfBlocks(f"swap_in: {len(seq.table)} blocks needed, {self.num_free_blocks()} free")
        gpu = [self._new_block() for _ in seq.table]
        for c, g in zip(seq.table, gpu, strict=True):
            self.storage.swap_in(c, g)
        self.cpu_free.extend(reversed(seq.table))
        seq.table, seq.swapped = gpu, False
        for i, h in enumerate(seq.hashes):
            self._register(seq, i, h)

    # ---- internals
    def _seq(self, seq_id):
        if seq_id not in self.seqs:
            raise KeyError(f"seq_id {seq_id!r} is not allocated")
        return self.seqs[seq_id]

    def _resident(self, seq_id, what):
        seq = self._seq(seq_id)
        if seq.swapped:
            raise ValueError(f"{what}: seq_id {seq_id!r} is swapped out")
        return seq

    def _hash(self, parent, block_tokens):
        return hash((parent, tuple(block_tokens)))

    def _chain(self, tokens):
        hashes, parent = [], None
        for i in range(len(tokens) // self.B):
            parent = self._hash(parent, tokens[i * self.B:(i + 1) * self.B])
            hashes.append(parent)
        return hashes

    def _prefix_hits(self, hashes):
        hits = []
        for h in hashes:
            if h not in self.cache:
                break
            hits.append(self.cache[h])
        return hits

    def _register(self, seq, i, h):
        """Full block i of seq enters the cache (the first block seen with a hash keeps it)."""
        if i == len(seq.hashes):
            seq.hashes.append(h)
        if h not in self.cache:
            self.cache[h] = seq.table[i]
            self.block_hash[seq.table[i]] = h

    def _take(self, b):  # a cache hit: the block gains a reference (leaving the evictable set if idle)
        self.evictable.pop(b, None)
        self.ref[b] += 1

    def _new_block(self):
        if self.free_stack:
            b = self.free_stack.pop()
        else:
            b, h = self.evictable.popitem(last=False)  # evict the least recently used cached block
            del self.cache[h], self.block_hash[b]
        self.ref[b] = 1
        return b

    def _make_last_writable(self, seq):
        """Copy-on-write: a shared last block is copied into a private one before the write."""
        b = seq.table[-1]
        if self.ref[b] > 1:
            new = self._new_block()
            self.storage.copy(b, new)
            self.ref[b] -= 1
            seq.table[-1] = new

    def _write(self, seq_id, seq, pos):
        self.storage.write(seq.table[pos // self.B], pos % self.B, seq_id, pos)

    def _release_all(self, table):
        for b in reversed(table):  # tail blocks first, so they are evicted before the prefix
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self._park(b)

    def _park(self, b):
        if b in self.block_hash:
            self.evictable[b] = self.block_hash[b]  # most recently used end
        else:
            self.free_stack.append(b)


register("block_manager", "simple", cite="Kwon et al. 2023, vLLM, Sec. 4.2-4.5",
         caps={"prefix_caching": True, "swap": True})(SimpleBlockManager)
