"""vLLM-v1-style block pool: one doubly-linked free queue that also serves as the LRU eviction order.

Every block is a record (id, ref_cnt, block_hash).  Free blocks -- cached or not -- sit in one queue;
allocation pops the head and, if the block still carries a hash, evicts it from the hash index.
Freed blocks are appended to the tail in reverse table order, so a request's last blocks are evicted
before its prefix.  A cache hit on an idle block unlinks it from the middle of the queue in O(1).
Full-block hashes are SHA-256 of (parent hash, tokens).  Invariant: a block is in the free queue iff
its ref_cnt is 0.  vLLM v1 `BlockPool` / `FreeKVCacheBlockQueue` (vllm/v1/core/block_pool.py, kv_cache_utils.py);
Kwon et al. 2023, Sec. 4.3-4.5.
"""

from __future__ import annotations

import hashlib

from llm_inference_harness.contracts.block_manager import (
    OutOfBlocks,
    check_block,
    check_geometry,
    check_token,
    check_tokens,
)
from llm_inference_harness.engine.registry import register


class Block:
    __slots__ = ("id", "ref_cnt", "block_hash", "prev", "next")

    def __init__(self, block_id):
        self.id, self.ref_cnt, self.block_hash, self.prev, self.next = block_id, 0, None, None, None


class FreeQueue:
    """Doubly-linked list of free blocks with sentinels: popleft, append, remove in O(1)."""

    def __init__(self, blocks):
        self.head, self.tail, self.n = Block(-1), Block(-1), 0
        self.head.next, self.tail.prev = self.tail, self.head
        for b in blocks:
            self.append(b)

    def append(self, b):
        b.prev, b.next = self.tail.prev, self.tail
        self.tail.prev.next = b
        self.tail.prev = b
        self.n += 1

    def remove(self, b):
        b.prev.next, b.next.prev = b.next, b.prev
        b.prev = b.next = None
        self.n -= 1

    def popleft(self):
        b = self.head.next
        self.remove(b)
        return b


class VllmStyleBlockManager:
    def __init__(self, num_blocks, block_size, storage, *, num_cpu_blocks=0):
        check_geometry(num_blocks, block_size, num_cpu_blocks)
        self.block_size, self.storage = block_size, storage
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeQueue(self.blocks)
        self.hash_to_block: dict[bytes, Block] = {}
        self.cpu_free = list(range(num_cpu_blocks))
        self.tables: dict[int, list[Block] | list[int]] = {}  # GPU Blocks, or CPU ids while swapped
        self.tokens: dict[int, list[int]] = {}
        self.hashes: dict[int, list[bytes]] = {}  # chained hashes of each sequence's full blocks
        self.swapped: set[int] = set()

    def block_table(self, seq_id):
        self._check(seq_id)
        t = self.tables[seq_id]
        return list(t) if seq_id in self.swapped else [b.id for b in t]

    def is_swapped(self, seq_id):
        self._check(seq_id)
        return seq_id in self.swapped

    def num_tokens(self, seq_id):
        self._check(seq_id)
        return len(self.tokens[seq_id])

    def ref_count(self, block):
        return self.blocks[check_block(block, len(self.blocks))].ref_cnt

    def num_free_blocks(self):
        return self.free_queue.n

    def num_free_cpu_blocks(self):
        return len(self.cpu_free)

    def lookup_prefix(self, tokens):
        return self.block_size * len(self._computed_blocks(check_tokens(tokens)))

    def allocate(self, seq_id, tokens):
        tokens = check_tokens(tokens)
        if seq_id in self.tables:
            raise ValueError(f"allocate: seq_id {seq_id!r} is already allocated")
        computed = self._computed_blocks(tokens)
        n_new = -(-len(tokens) // self.block_size) - len(computed)
        if n_new + sum(b.ref_cnt == 0 for b in computed) > self.free_queue.n:
            raise OutOfBlocks(f"allocate: {n_new} new blocks needed, {self.free_queue.n} free")
        for b in computed:  # touch: idle cached blocks leave the free queue
            if b.ref_cnt == 0:
                self.free_queue.remove(b)
            b.ref_cnt += 1
        self.tables[seq_id], self.tokens[seq_id] = computed + self._get_new_blocks(n_new), list(tokens)
        self.hashes[seq_id] = self._hashes(tokens)
        for pos in range(len(computed) * self.block_size, len(tokens)):
            self._write(seq_id, pos)
        self._cache_full_blocks(seq_id, len(computed))
        return len(computed) * self.block_size

    def append(self, seq_id, token):
        table, n, token = self._resident(seq_id, "append"), len(self.tokens[seq_id]), check_token(token)
        boundary = n % self.block_size == 0
        if (boundary or table[-1].ref_cnt > 1) and self.free_queue.n == 0:
            raise OutOfBlocks(f"append: sequence {seq_id} needs a block and none is free")
        if boundary:
            table.extend(self._get_new_blocks(1))
        elif table[-1].ref_cnt > 1:  # copy-on-write of the shared partial last block
            (fresh,) = self._get_new_blocks(1)
            self.storage.copy(table[-1].id, fresh.id)
            table[-1].ref_cnt -= 1
            table[-1] = fresh
        self.tokens[seq_id].append(token)
        self._write(seq_id, n)
        if (n + 1) % self.block_size == 0:
            parent = self.hashes[seq_id][-1] if self.hashes[seq_id] else b""
            self.hashes[seq_id].append(self._hash(parent, self.tokens[seq_id][-self.block_size:]))
            self._cache_full_blocks(seq_id, n // self.block_size)

    def fork(self, parent_id, child_id):
        table = self._resident(parent_id, "fork")
        if child_id in self.tables:
            raise ValueError(f"fork: child_id {child_id!r} is already allocated")
        for b in table:
            b.ref_cnt += 1
        self.tables[child_id], self.tokens[child_id] = list(table), list(self.tokens[parent_id])
        self.hashes[child_id] = list(self.hashes[parent_id])

    def free(self, seq_id):
        self._check(seq_id)
        if seq_id in self.swapped:
            self.cpu_free.extend(self.tables[seq_id])
            self.swapped.discard(seq_id)
        else:
            self._free_blocks(self.tables[seq_id])
        del self.tables[seq_id], self.tokens[seq_id], self.hashes[seq_id]

    def swap_out(self, seq_id):
        table = self._resident(seq_id, "swap_out")
        if len(table) > len(self.cpu_free):
            raise OutOfBlocks(f"swap_out: {len(table)} CPU blocks needed, {len(self.cpu_free)} free")
        cpu, self.cpu_free = self.cpu_free[:len(table)], self.cpu_free[len(table):]
        for b, c in zip(table, cpu, strict=True):
            self.storage.swap_out(b.id, c)
        self._free_blocks(table)
        self.tables[seq_id] = cpu
        self.swapped.add(seq_id)

    def swap_in(self, seq_id):
        self._check(seq_id)
        if seq_id not in self.swapped:
            raise ValueError(f"swap_in: seq_id {seq_id!r} is not swapped out")
        cpu = self.tables[seq_id]
        if len(cpu) > self.free_queue.n:
            raise OutOfBlocks(f"swap_in: {len(cpu)} blocks needed, {self.free_queue.n} free")
        gpu = self._get_new_blocks(len(cpu))
        for c, b in zip(cpu, gpu, strict=True):
            self.storage.swap_in(c, b.id)
        self.cpu_free.extend(cpu)
        self.tables[seq_id] = gpu
        self.swapped.discard(seq_id)
        self._cache_full_blocks(seq_id, 0)

    # ---- internals
    def _check(self, seq_id):
        if seq_id not in self.tables:
            raise KeyError(f"seq_id {seq_id!r} is not allocated")

    def _resident(self, seq_id, what):
        self._check(seq_id)
        if seq_id in self.swapped:
            raise ValueError(f"{what}: seq_id {seq_id!r} is swapped out")
        return self.tables[seq_id]

    def _hash(self, parent, block_tokens):
        return hashlib.sha256(parent + repr(list(block_tokens)).encode()).digest()

    def _hashes(self, tokens):
        """Chained SHA-256 of each full block: equal hashes mean equal whole prefixes."""
        out, parent, B = [], b"", self.block_size
        for i in range(len(tokens) // B):
            parent = self._hash(parent, tokens[i * B:(i + 1) * B])
            out.append(parent)
        return out

    def _computed_blocks(self, tokens):
        hits = []
        for h in self._hashes(tokens):
            b = self.hash_to_block.get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def _cache_full_blocks(self, seq_id, start):
        table, hashes = self.tables[seq_id], self.hashes[seq_id]
        for i in range(start, len(hashes)):
            if hashes[i] not in self.hash_to_block and table[i].block_hash is None:
                table[i].block_hash = hashes[i]
                self.hash_to_block[hashes[i]] = table[i]

    def _get_new_blocks(self, n):
        out = []
        for _ in range(n):
            b = self.free_queue.popleft()
            if b.block_hash is not None:  # evict: the least recently freed cached block
                del self.hash_to_block[b.block_hash]
                b.block_hash = None
            b.ref_cnt = 1
            out.append(b)
        return out

    def _free_blocks(self, table):
        for b in reversed(table):
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.free_queue.append(b)

    def _write(self, seq_id, pos):
        B = self.block_size
        self.storage.write(self.tables[seq_id][pos // B].id, pos % B, seq_id, pos)


register("block_manager", "vllm_style", cite="vLLM v1 BlockPool; Kwon et al. 2023, Sec. 4.3-4.5",
         caps={"prefix_caching": True, "swap": True})(VllmStyleBlockManager)
