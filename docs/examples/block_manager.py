"""A block manager in one class: a plugin for the block_manager contract (harness/contracts/block_manager.py).

Free blocks are a stack; cached blocks nobody references wait in an LRU dict until evicted; full blocks are
found by a hash chained with the previous block's (equal hashes mean equal whole prefixes).  A shared last
block is copied before it is written (copy-on-write).  Kwon et al. 2023, "vLLM", Sec. 4.2-4.5.

    harness check block_manager --plugin docs/examples/block_manager.py:BlockManager
"""

from collections import OrderedDict

from llm_inference_harness.contracts.block_manager import (
    OutOfBlocks,
    check_block,
    check_geometry,
    check_token,
    check_tokens,
)


class BlockManager:
    def __init__(self, num_blocks, block_size, storage, *, num_cpu_blocks=0):
        check_geometry(num_blocks, block_size, num_cpu_blocks)
        self.B, self.storage = block_size, storage
        self.ref = [0] * num_blocks
        self.free_blocks = list(range(num_blocks - 1, -1, -1))  # never used (or evicted) blocks
        self.idle = OrderedDict()  # cached block nobody references -> its hash, least recently used first
        self.cache, self.hash_of = {}, {}  # chained hash -> block, block -> hash
        self.cpu_free = list(range(num_cpu_blocks - 1, -1, -1))
        self.seqs = {}  # seq_id -> {"tokens", "table", "hashes", "swapped"}

    # queries
    def block_table(self, seq_id):
        return list(self._seq(seq_id)["table"])

    def is_swapped(self, seq_id):
        return self._seq(seq_id)["swapped"]

    def num_tokens(self, seq_id):
        return len(self._seq(seq_id)["tokens"])

    def ref_count(self, block):
        return self.ref[check_block(block, len(self.ref))]

    def num_free_blocks(self):
        return len(self.free_blocks) + len(self.idle)

    def num_free_cpu_blocks(self):
        return len(self.cpu_free)

    def lookup_prefix(self, tokens):
        return self.B * len(self._hits(self._chain(check_tokens(tokens))))

    # lifecycle
    def allocate(self, seq_id, tokens):
        tokens = check_tokens(tokens)
        if seq_id in self.seqs:
            raise ValueError(f"allocate: seq_id {seq_id!r} is already allocated")
        hashes = self._chain(tokens)
        hits, n = self._hits(hashes), -(-len(tokens) // self.B)
        if n - len(hits) + sum(self.ref[b] == 0 for b in hits) > self.num_free_blocks():
            raise OutOfBlocks(f"allocate: {n} blocks needed, {self.num_free_blocks()} free")
        for b in hits:  # a hit gains a reference and leaves the idle set
            self.idle.pop(b, None)
            self.ref[b] += 1
        seq = {"tokens": list(tokens), "table": hits + [self._new() for _ in range(n - len(hits))], "hashes": [],
               "swapped": False}
        self.seqs[seq_id] = seq
        for pos in range(len(hits) * self.B, len(tokens)):
            self.storage.write(seq["table"][pos // self.B], pos % self.B, seq_id, pos)
        for i, h in enumerate(hashes):
            self._cache(seq, i, h)
        return len(hits) * self.B

    def append(self, seq_id, token):
        seq, token = self._resident(seq_id, "append"), check_token(token)
        n, table = len(seq["tokens"]), seq["table"]
        if (n % self.B == 0 or self.ref[table[-1]] > 1) and self.num_free_blocks() == 0:
            raise OutOfBlocks(f"append: sequence {seq_id} needs a block and none is free")
        if n % self.B == 0:
            table.append(self._new())
        elif self.ref[table[-1]] > 1:  # copy-on-write
            new = self._new()
            self.storage.copy(table[-1], new)
            self.ref[table[-1]] -= 1
            table[-1] = new
        seq["tokens"].append(token)
        self.storage.write(table[-1], n % self.B, seq_id, n)
        if (n + 1) % self.B == 0:
            parent = seq["hashes"][-1] if seq["hashes"] else None
            self._cache(seq, n // self.B, hash((parent, tuple(seq["tokens"][-self.B:]))))

    def fork(self, parent_id, child_id):
        parent = self._resident(parent_id, "fork")
        if child_id in self.seqs:
            raise ValueError(f"fork: child_id {child_id!r} is already allocated")
        for b in parent["table"]:
            self.ref[b] += 1
        self.seqs[child_id] = {**parent, "tokens": list(parent["tokens"]), "table": list(parent["table"]),
                               "hashes": list(parent["hashes"])}

    def free(self, seq_id):
        seq = self._seq(seq_id)
        if seq["swapped"]:
            self.cpu_free.extend(reversed(seq["table"]))
        else:
            self._release(seq["table"])
        del self.seqs[seq_id]

    def swap_out(self, seq_id):
        seq = self._resident(seq_id, "swap_out")
        if len(seq["table"]) > len(self.cpu_free):
            raise OutOfBlocks(f"swap_out: {len(seq['table'])} CPU blocks needed, {len(self.cpu_free)} free")
        cpu = [self.cpu_free.pop() for _ in seq["table"]]
        for g, c in zip(seq["table"], cpu, strict=True):
            self.storage.swap_out(g, c)
        self._release(seq["table"])
        seq["table"], seq["swapped"] = cpu, True

    def swap_in(self, seq_id):
        seq = self._seq(seq_id)
        if not seq["swapped"]:
            raise ValueError(f"swap_in: seq_id {seq_id!r} is not swapped out")
        if len(seq["table"]) > self.num_free_blocks():
            raise OutOfBlocks(f"swap_in: {len(seq['table'])} blocks needed, {self.num_free_blocks()} free")
        gpu = [self._new() for _ in seq["table"]]
        for c, g in zip(seq["table"], gpu, strict=True):
            self.storage.swap_in(c, g)
        self.cpu_free.extend(reversed(seq["table"]))
        seq["table"], seq["swapped"] = gpu, False
        for i, h in enumerate(seq["hashes"]):
            self._cache(seq, i, h)

    # internals
    def _seq(self, seq_id):
        if seq_id not in self.seqs:
            raise KeyError(f"seq_id {seq_id!r} is not allocated")
        return self.seqs[seq_id]

    def _resident(self, seq_id, what):
        seq = self._seq(seq_id)
        if seq["swapped"]:
            raise ValueError(f"{what}: seq_id {seq_id!r} is swapped out")
        return seq

    def _chain(self, tokens):
        hashes, parent = [], None
        for i in range(len(tokens) // self.B):
            parent = hash((parent, tuple(tokens[i * self.B:(i + 1) * self.B])))
            hashes.append(parent)
        return hashes

    def _hits(self, hashes):
        hits = []
        for h in hashes:
            if h not in self.cache:
                break
            hits.append(self.cache[h])
        return hits

    def _cache(self, seq, i, h):  # full block i of seq enters the prefix cache; the first block with a hash keeps it
        if i == len(seq["hashes"]):
            seq["hashes"].append(h)
        if h not in self.cache:
            self.cache[h], self.hash_of[seq["table"][i]] = seq["table"][i], h

    def _new(self):
        if self.free_blocks:
            b = self.free_blocks.pop()
        else:  # evict the least recently used idle cached block
            b, h = self.idle.popitem(last=False)
            del self.cache[h], self.hash_of[b]
        self.ref[b] = 1
        return b

    def _release(self, table):
        for b in reversed(table):  # tail blocks first: they are evicted before the prefix
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if b in self.hash_of:
                    self.idle[b] = self.hash_of[b]
                else:
                    self.free_blocks.append(b)
