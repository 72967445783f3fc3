"""Known-wrong block managers, each the straightforward manager with one real bug switched on.

The bugs are the ones paged KV caches have shipped or nearly shipped: a forked sequence writing into
its parent's partial block, a shared block leaked on free, a slot computed from the length before the
append, block hashes that forget their prefix (vLLM moved to chained, then SHA-256, hashes), and a
cached-token count that outlives the eviction of the blocks it counted.
"""

from harness.contracts.block_manager import OutOfBlocks, check_tokens
from harness.registry import register
from impls.block_manager.simple import Seq, SimpleBlockManager


class NoCopyOnWrite(SimpleBlockManager):
    def _make_last_writable(self, seq):
        pass  # BUG: the shared partial last block is written in place


class LeaksSharedBlocks(SimpleBlockManager):
    def _release_all(self, table):
        for b in reversed(table):
            if self.ref[b] == 1:  # BUG: a shared block's count is not decremented
                self.ref[b] = 0
                self._park(b)


class SlotOffByOne(SimpleBlockManager):
    def _write(self, seq_id, seq, pos):
        block = seq.table[max(pos - 1, 0) // self.B]  # BUG: block index from the length before the append
        self.storage.write(block, pos % self.B, seq_id, pos)


class UnchainedHash(SimpleBlockManager):
    def _chain(self, tokens):  # BUG: each block hashed alone, so [x, b] and [y, b] share block b
        return [self._hash(None, tokens[i * self.B:(i + 1) * self.B]) for i in range(len(tokens) // self.B)]


class StaleCachedCount(SimpleBlockManager):
    """Counts cached tokens from every hash ever cached, instead of those still in the cache."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.ever_cached: set[int] = set()

    def _register(self, seq, i, h):
        super()._register(seq, i, h)
        self.ever_cached.add(h)

    def allocate(self, seq_id, tokens):
        tokens = check_tokens(tokens)
        if seq_id in self.seqs:
            raise ValueError(f"allocate: seq_id {seq_id!r} is already allocated")
        hashes = self._chain(tokens)
        hits = self._prefix_hits(hashes)
        cached = self.B * next((i for i, h in enumerate(hashes) if h not in self.ever_cached), len(hashes))  # BUG
        n_blocks = -(-len(tokens) // self.B)
        if n_blocks - len(hits) + sum(self.ref[b] == 0 for b in hits) > self.num_free_blocks():
            raise OutOfBlocks(f"allocate: {n_blocks} blocks needed, {self.num_free_blocks()} free")
        for b in hits:
            self._take(b)
        seq = Seq(list(tokens), hits + [self._new_block() for _ in range(n_blocks - len(hits))])
        self.seqs[seq_id] = seq
        for pos in range(cached, len(tokens)):
            self._write(seq_id, seq, pos)
        for i, h in enumerate(hashes):
            self._register(seq, i, h)
        return cached


MUTANTS = {
    "no_copy_on_write": (NoCopyOnWrite, "no copy-on-write: a shared partial block is written in place",
                         "machine_data"),
    "leaks_shared_blocks": (LeaksSharedBlocks, "free does not decrement the count of shared blocks (leak)",
                            "machine_bookkeeping"),
    "slot_off_by_one": (SlotOffByOne, "logical->physical index off by one at block boundaries",
                        "machine_data"),
    "unchained_hash": (UnchainedHash, "prefix hash not chained with the parent block's hash", "machine_data"),
    "stale_cached_count": (StaleCachedCount, "cached-token count from hashes evicted since (stale)",
                           "machine_data"),
}
for _name, (_cls, _bug, _killer) in MUTANTS.items():
    register("block_manager", f"mutant_{_name}", mutant=True, bug=_bug, killed_by=(_killer,),
             caps={"prefix_caching": True, "swap": True})(_cls)
