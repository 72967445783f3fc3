"""Known-wrong block managers, each the straightforward manager with one real bug switched on.

The bugs are the ones paged KV caches have shipped or nearly shipped: a forked sequence writing into
its parent's partial block, a shared block leaked on free, a slot computed from the length before the
append, block hashes that forget their prefix (vLLM moved to chained, then SHA-256, hashes) or keep only the
block before it, and a cached-token count that outlives the eviction of the blocks it counted.  A second group
models bugs of preemption and of error paths, where the old state machine never looked: copy-on-write skipped after a
swap-in, swapped blocks restored in CPU-id order, LRU places refreshed by free but not by swap_out, cache
hits touched before the capacity check, reference counts raised before a duplicate child id is seen, hits
taken before a duplicate seq_id is seen, a swap-in rolled back after evicting cached blocks, CPU blocks of a
sequence freed while swapped out never returned, an evicted block left in the prefix cache; and of size:
block ids kept in a byte, tables capped at 512 entries (a fixed max_num_blocks_per_seq).
"""

from llm_inference_harness.contracts.block_manager import OutOfBlocks, check_tokens
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.block_manager.simple import Seq, SimpleBlockManager


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


class KeyOverPreviousTokens(SimpleBlockManager):
    def _hash(self, parent, block_tokens):  # BUG: keyed by the previous block's tokens, not by its key: two histories
        return (parent[1] if parent else None, tuple(block_tokens))  # that agree on two blocks share the second's


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


class CowSkippedAfterSwap(SimpleBlockManager):
    """Decides copy-on-write by a 'fresh from swap_in' flag (swap_in makes private blocks) until the next block."""

    def swap_in(self, seq_id):
        super().swap_in(seq_id)
        self.seqs[seq_id].fresh = True

    def append(self, seq_id, token):
        seq = self._resident(seq_id, "append")
        if len(seq.tokens) % self.B == 0:
            seq.fresh = False
        super().append(seq_id, token)

    def _make_last_writable(self, seq):
        if getattr(seq, "fresh", False):  # BUG: a fork since swap_in shares the last block again (count 2)
            return
        super()._make_last_writable(seq)


class SwapInCpuIdOrder(SimpleBlockManager):
    def swap_in(self, seq_id):
        seq = self._seq(seq_id)
        if seq.swapped and len(seq.table) <= self.num_free_blocks():
            seq.table.sort()  # BUG: CPU blocks restored in id order, not logical order (wrong once they recycle)
        super().swap_in(seq_id)


class SwapOutKeepsLruPlace(SimpleBlockManager):
    """LRU places refreshed when free releases a block, not when swap_out does (vLLM v0's evictor ordered blocks
    by last-access times that preemption did not update)."""

    def swap_out(self, seq_id):
        parked = set(self.evictable)
        super().swap_out(seq_id)
        for b in [b for b in self.evictable if b not in parked]:
            self.evictable.move_to_end(b, last=False)  # BUG: evicted first, as if released long ago


class TouchBeforeCapacity(SimpleBlockManager):
    def allocate(self, seq_id, tokens):
        for b in self._prefix_hits(self._chain(check_tokens(tokens))):
            if b in self.evictable:
                self.evictable.move_to_end(b)  # BUG: idle hits touched before the request is known to fit
        return super().allocate(seq_id, tokens)


class ForkCountsBeforeCheck(SimpleBlockManager):
    def fork(self, parent_id, child_id):
        for b in self._resident(parent_id, "fork").table:
            self.ref[b] += 1  # BUG: counts raised before the child id is checked, not lowered when it is rejected
        if child_id in self.seqs:
            raise ValueError(f"fork: child_id {child_id!r} is already allocated")
        self.seqs[child_id] = Seq(list(self.seqs[parent_id].tokens), list(self.seqs[parent_id].table),
                                  list(self.seqs[parent_id].hashes))


class HitsBeforeIdCheck(SimpleBlockManager):
    def allocate(self, seq_id, tokens):
        if seq_id in self.seqs:
            for b in self._prefix_hits(self._chain(check_tokens(tokens))):
                self._take(b)  # BUG: cache hits taken before the duplicate seq_id is seen
            raise ValueError(f"allocate: seq_id {seq_id!r} is already allocated")
        return super().allocate(seq_id, tokens)


class SwapInRollbackEvicts(SimpleBlockManager):
    """swap_in takes blocks one by one; out of blocks, it gives back those it took -- evicted from the cache."""

    def swap_in(self, seq_id):
        seq = self._seq(seq_id)
        if seq.swapped and len(seq.table) > self.num_free_blocks():
            for b in [self._new_block() for _ in range(self.num_free_blocks())]:
                self.ref[b] = 0
                self.free_stack.append(b)  # BUG: the cached blocks it evicted come back empty, out of the cache
        super().swap_in(seq_id)


class SwappedFreeLeaksCpu(SimpleBlockManager):
    def free(self, seq_id):
        if self._seq(seq_id).swapped:
            del self.seqs[seq_id]  # BUG: a request aborted while swapped out keeps its CPU blocks
            return
        super().free(seq_id)


class EvictionKeepsHash(SimpleBlockManager):
    def _new_block(self):
        if self.free_stack:
            b = self.free_stack.pop()
        else:
            b, _ = self.evictable.popitem(last=False)  # BUG: the cache still maps the evicted block's hash to it
            self.block_hash.pop(b)
        self.ref[b] = 1
        return b


class ByteBlockIds(SimpleBlockManager):
    def _write(self, seq_id, seq, pos):  # BUG: block ids kept in a byte: past 256 blocks they wrap
        self.storage.write(seq.table[pos // self.B] % 256, pos % self.B, seq_id, pos)


class TableCapped512(SimpleBlockManager):
    def _write(self, seq_id, seq, pos):  # BUG: max_num_blocks_per_seq = 512: logical block i read at i % 512
        self.storage.write(seq.table[(pos // self.B) % 512], pos % self.B, seq_id, pos)


MUTANTS = {
    "no_copy_on_write": (NoCopyOnWrite, "no copy-on-write: a shared partial block is written in place",
                         "machine_data"),
    "leaks_shared_blocks": (LeaksSharedBlocks, "free does not decrement the count of shared blocks (leak)",
                            "machine_bookkeeping"),
    "slot_off_by_one": (SlotOffByOne, "logical->physical index off by one at block boundaries",
                        "machine_data"),
    "unchained_hash": (UnchainedHash, "prefix hash not chained with the parent block's hash", "machine_data"),
    "key_over_previous_tokens": (KeyOverPreviousTokens, "a block's cache key chained over the previous block's "
                                 "tokens, not its key: prompts that differ earlier share a cached block",
                                 "machine_data"),
    "stale_cached_count": (StaleCachedCount, "cached-token count from hashes evicted since (stale)",
                           "machine_data"),
    "cow_skipped_after_swap": (CowSkippedAfterSwap, "copy-on-write skipped after swap_in: a fork since then shares "
                               "the last block (count 2), written in place", "machine_data"),
    "swap_in_cpu_id_order": (SwapInCpuIdOrder, "swap_in restores CPU blocks in id order, not logical order",
                             "machine_data"),
    "swap_out_keeps_lru_place": (SwapOutKeepsLruPlace, "blocks released by swap_out keep their old LRU place "
                                 "(evicted first)", "evicts_least_recently_used"),
    "touch_before_capacity": (TouchBeforeCapacity, "an allocate that runs out has already moved its idle cache "
                              "hits to the most recently used end", "evicts_least_recently_used"),
    "fork_counts_before_check": (ForkCountsBeforeCheck, "a fork rejected for a live child_id leaves the parent's "
                                 "counts raised", "machine_bookkeeping"),
    "hits_before_id_check": (HitsBeforeIdCheck, "an allocate rejected for a live seq_id leaves its cache hits taken",
                             "machine_bookkeeping"),
    "swap_in_rollback_evicts": (SwapInRollbackEvicts, "a swap_in that runs out has evicted cached blocks on the way",
                                "machine_bookkeeping"),
    "swapped_free_leaks_cpu": (SwappedFreeLeaksCpu, "free of a swapped-out sequence does not return its CPU blocks",
                               "machine_bookkeeping"),
    "eviction_keeps_hash": (EvictionKeepsHash, "an evicted block stays in the prefix cache: a later hit reads the "
                            "block's new contents", "machine_data"),
    "byte_block_ids": (ByteBlockIds, "block ids kept in a byte: wrong past 256 blocks", "large_tables"),
    "table_capped_512": (TableCapped512, "block tables capped at 512 entries: wrong past 512 blocks",
                         "large_tables"),
}
for _name, (_cls, _bug, _killer) in MUTANTS.items():
    register("block_manager", f"mutant_{_name}", mutant=True, bug=_bug, killed_by=(_killer,),
             caps={"prefix_caching": True, "swap": True})(_cls)
