"""The prefix cache: a RAM tier (trie + LRU by bytes) in front of an optional SSD tier.

Entries are per-layer cache objects (KVCache, RotatingKVCache, ArraysCache)
taken *exactly* at a token boundary (a checkpoint), so they are never
trimmed: that is what makes sliding-window and recurrent layers reusable.
A hit hands out a private copy (the batch mutates what it is given) and
refreshes the entry's recency. Only the engine thread touches it. Past a whole entry's
hit, an entry of KV layers (or encoded rows, past kv.start: `cut_from`) the prompt shares
more tokens with gives a copy of its first slots.

An entry that extends a stored one holds only its new tokens' KV, over that one (its
parent), when every layer is a KVCache (whose slots are the tokens) and the parent's KV is
bit for bit the new entry's own first slots: a conversation's checkpoints and turns then
share the system prompt's KV instead of each holding a copy. A hit joins the chain.
"""

from __future__ import annotations

import copy
import itertools
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from appliance.engine.trie import TokenTrie


def snapshot(cache: list) -> list:
    """A copy of a cache that goes on being filled, as cheap as is safe: a KVCache only
    ever writes past its offset (or into a new, larger buffer), so its arrays can be
    shared; other layer kinds (a wrapping window, recurrent state) are copied."""
    from mlx_lm.models.cache import KVCache

    return [copy.copy(c) if type(c) is KVCache else copy.deepcopy(c) for c in cache]


def materialize(cache: list) -> None:
    """Queue an entry's arrays for evaluation. A row's cache taken from the batch is a lazy
    slice: left unevaluated, it keeps the whole batch buffer it was cut from alive (every
    row, the full padded length) while `nbytes` reports only the slice. Evaluated, it holds
    its own buffer and `nbytes` is what MLX holds (tests/test_memory.py checks it). Queued,
    not waited for: a store comes after the step's next pass is queued, and waiting would
    hold the engine's host work back until that pass ends (on a launch-bound GPU that host
    work is what overlaps the pass). Its memory is taken when it is queued (MLX allocates
    an output as it encodes the op), so an allocation failure still raises here."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    mx.async_eval([x for c in cache for _, x in tree_flatten(c.state)
                   if isinstance(x, mx.array)])


@dataclass
class TierStats:
    hits: int = 0
    misses: int = 0
    hit_tokens: int = 0
    inserts: int = 0
    evictions: int = 0
    deltas: int = 0  # inserts stored as the slots after a stored entry


MAX_CHAIN = 32  # a hit joins at most this many parts (the root and its deltas)


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    cache: list  # whole, or (with a parent) only the slots after the parent's tokens
    nbytes: int
    parent: tuple[int, ...] | None = None
    depth: int = 0  # parts before this one in its chain
    children: int = 0  # entries stored over this one
    serial: int = field(default_factory=lambda: next(_SERIALS))  # (never reused, as ids are)


_SERIALS = itertools.count(1)


def joined(parts: list[list], release: bool = False) -> list:
    """One cache from a chain's parts (each a list of KVCache layers; an encoded row's
    entry is one part), the root first: each layer's filled slots in order. `release`:
    evaluate layer by layer and let each layer's parts go once joined, so the copy held
    beside the parts is one layer's, not the whole prefix's (the SSD tier's blobs, read for
    this one join)."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    out = []
    for layers in zip(*parts, strict=True):
        if type(layers[0]) is not KVCache:  # an encoded row: stored whole, a chain of one
            (c,) = layers
            out.append(c.cut(c.offset))
            if release:
                mx.eval(out[-1].keys, out[-1].values)
                c.keys = c.values = None
            continue
        keys = mx.concatenate([c.keys[..., :c.offset, :] for c in layers], axis=2)
        values = mx.concatenate([c.values[..., :c.offset, :] for c in layers], axis=2)
        if release:
            mx.eval(keys, values)
            for c in layers:
                c.keys = c.values = None
        out.append(KVCache.from_state((keys, values, keys.shape[2])))
    return out


def kv_only(cache: list) -> bool:
    from mlx_lm.models.cache import KVCache

    return all(type(c) is KVCache and c.keys is not None for c in cache)


def cut_from(cache: list, start: int) -> int | None:
    """The fewest tokens an entry's first slots may serve as a prefix (a hit on a longer
    entry), or None (never: a window's slots wrap, recurrent state is the whole past).
    KV layers: any. Encoded rows (one code per token): from `start` (kv.start) on, as a
    row holding that many tokens is encoded too; below it a row's KV is float."""
    from mlx_lm.models.cache import KVCache

    from appliance.engine.kv.quantized import QuantRowCache

    if kv_only(cache):
        return 0
    if all((type(c) is KVCache or type(c) is QuantRowCache) and c.keys is not None
           for c in cache):
        return start
    return None


@dataclass
class RamTier:
    """Prefix entries within `cap_bytes` (and within a moving `limit` the engine sets)."""

    cap_bytes: int
    encoded_from: int = 0  # kv.start: where an encoded entry's first slots may be cut
    stats: TierStats = field(default_factory=TierStats)
    _trie: TokenTrie = field(default_factory=TokenTrie)
    _lru: OrderedDict = field(default_factory=OrderedDict)  # tokens -> _Entry, oldest first
    nbytes: int = 0
    hit_chain: frozenset = frozenset()  # the last lookup's entries (`serials`)

    def __len__(self) -> int:
        return len(self._lru)

    def lookup(self, tokens: list[int]) -> tuple[int, list | None]:
        """The longest stored prefix of tokens[:-1] (one token must remain to run):
        (its length, a private copy of its cache), or (0, None). Where a stored entry of
        KV layers shares more of them than any whole entry does, its first slots are that
        prefix: an agent's next turn re-tokenizes its last reply, which often parts from
        the tokens it generated (mlx-lm's samples are not the tokenizer's own spelling),
        and a whole-entry hit then stopped at the turn's prompt: 10 of 16 later turns in a
        CPU agents run prefilled their last reply again (mlx_lm.server kept 9-61 of its
        64 tokens)."""
        best = self._trie.longest(tokens[:-1])
        shared, key = self._trie.shared(tokens[:-1]) if best else (0, None)
        self.hit_chain = frozenset()
        if shared > best and all((f := cut_from(e.cache, self.encoded_from)) is not None
                                 and shared >= f for e in self._chain(key)):
            # (only past a whole entry's hit: alone, a few shared template tokens would
            # make every new conversation a hit on some other one's entry)
            self._refresh(key)
            chain = [e for e in self._chain(key) if len(e.tokens) <= shared]
            self.hit_chain = frozenset(e.serial for e in chain)
            self.stats.hits += 1
            self.stats.hit_tokens += shared
            return shared, self._cut(key, shared)
        if not best:
            self.stats.misses += 1
            return 0, None
        key = tuple(tokens[:best])
        self.hit_chain = self.serials(key)
        self._refresh(key)  # a hit refreshes recency
        self.stats.hits += 1
        self.stats.hit_tokens += best
        return best, self.cache_at(key)

    def _cut(self, key: tuple[int, ...], n: int) -> list:
        """A private copy of the first `n` slots of `key`'s stored cache (`cut_from`)."""
        from mlx_lm.models.cache import KVCache

        def first(c, k):  # (a view; `joined` copies it)
            if type(c) is KVCache:
                return KVCache.from_state((c.keys[..., :k, :], c.values[..., :k, :], k))
            view = copy.copy(c)
            view.offset = k
            return view

        parts, start = [], 0
        for e in self._chain(key):
            k = min(len(e.tokens), n) - start
            if k <= 0:
                break
            parts.append([first(c, k) for c in e.cache])
            start = len(e.tokens)
        out = joined(parts)
        materialize(out)
        return out

    def cache_at(self, key: tuple[int, ...]) -> list:
        """A private copy of the stored cache of `key`, its chain joined (no hit counted)."""
        chain = self._chain(key)
        if len(chain) == 1:
            return copy.deepcopy(chain[0].cache)
        return joined([e.cache for e in chain])

    def serials(self, key: tuple[int, ...]) -> frozenset:
        """The entries whose slots a cache built from `key`'s holds, bit for bit."""
        return frozenset(e.serial for e in self._chain(key))

    def insert(self, tokens: list[int], cache: list, limit: int | None = None,
               trusted: frozenset = frozenset()) -> frozenset:
        """Store a checkpoint of `tokens` (one already stored is only refreshed: entries
        may be built on it), then evict to fit. `trusted`: entries `cache` was built from
        (a hit, its row's own checkpoints): their slots need no comparison (`_parent`).
        Returns the new entry's chain (`serials`), for its row to trust in turn."""
        key = tuple(tokens)
        if not key:
            return frozenset()
        if key in self._lru:
            self._refresh(key)
            return frozenset()  # (another row's bits)
        parent = self._parent(key, cache, trusted)
        if parent is None:
            materialize(cache)
        else:
            parent, cache = parent
        nbytes = sum(c.nbytes for c in cache)
        budget = self.cap_bytes if limit is None else min(self.cap_bytes, limit)
        if nbytes > budget:
            return frozenset()  # would evict everything and still not fit
        depth = 0
        if parent is not None:
            above = self._lru[parent]
            above.children += 1
            depth = above.depth + 1
            self.stats.deltas += 1
        self._trie.add(key)
        self._lru[key] = _Entry(key, cache, nbytes, parent, depth)
        self._refresh(key)
        self.nbytes += nbytes
        self.stats.inserts += 1
        self.trim(budget)
        return self.serials(key) if key in self._lru else frozenset()

    def _parent(self, key: tuple[int, ...], cache: list,
                trusted: frozenset = frozenset()) -> tuple[tuple, list] | None:
        """(the stored entry `key` extends, a copy of the slots after it) when the new
        entry may be stored as a delta over it, else None (store it whole)."""
        if not kv_only(cache) or any(c.offset != len(key) for c in cache):
            return None
        m = self._trie.longest(key[:-1])
        if not m:
            return None
        chain = self._chain(key[:m])
        root = chain[0]
        if len(chain) >= MAX_CHAIN or not kv_only(root.cache) \
                or len(root.cache) != len(cache) \
                or any(c.offset != len(root.tokens) for c in root.cache):
            return None
        import mlx.core as mx
        from mlx_lm.models.cache import KVCache

        delta = [KVCache.from_state((mx.contiguous(c.keys[..., m:c.offset, :]),
                                     mx.contiguous(c.values[..., m:c.offset, :]),
                                     c.offset - m)) for c in cache]
        # The parent's KV must be the new entry's own first m slots, bit for bit: so it is
        # when the row was built on that entry (a hit, or its own earlier checkpoint:
        # `trusted`), but a row that computed the same prefix beside it may differ in the
        # last bits. (The comparison was ~3% of the engine's time in a CPU agents run.)
        if all(e.serial in trusted for e in chain):
            mx.async_eval([(c.keys, c.values) for c in delta])  # (see materialize)
            return key[:m], delta
        same, a = [], 0
        for e in chain:
            b = len(e.tokens)
            for mine, theirs in zip(cache, e.cache, strict=True):
                same += [mx.array_equal(mine.keys[..., a:b, :], theirs.keys[..., :b - a, :]),
                         mx.array_equal(mine.values[..., a:b, :], theirs.values[..., :b - a, :])]
            a = b
        same = mx.all(mx.stack(same))
        mx.eval(same, [(c.keys, c.values) for c in delta])
        return (key[:m], delta) if same.item() else None

    def _chain(self, key: tuple[int, ...]) -> list[_Entry]:
        """The entry of `key` and those it is built on, the root first."""
        chain = [self._lru[key]]
        while chain[-1].parent is not None:
            chain.append(self._lru[chain[-1].parent])
        return chain[::-1]

    def _refresh(self, key: tuple[int, ...]) -> None:
        """Most recently used: the entry, then what it is built on, so an entry is always
        more recent than those built on it and eviction (the oldest first) takes leaves."""
        for e in reversed(self._chain(key)):
            self._lru.move_to_end(e.tokens)

    def trim(self, limit: int) -> None:
        """Evict least recently used entries until at most `limit` bytes are held."""
        while self._lru and self.nbytes > limit:
            self._remove(next(iter(self._lru)))
            self.stats.evictions += 1

    def _remove(self, key: tuple[int, ...]) -> None:
        entry = self._lru.pop(key)
        assert not entry.children, "an entry others are built on outlived by them"
        if entry.parent is not None:
            self._lru[entry.parent].children -= 1
        self.nbytes -= entry.nbytes
        self._trie.remove(key)

    def check_integrity(self) -> None:
        assert self.nbytes == sum(e.nbytes for e in self._lru.values())
        assert self.nbytes <= self.cap_bytes
        assert len(self._trie) == len(self._lru)
        order = {k: i for i, k in enumerate(self._lru)}
        built = Counter(e.parent for e in self._lru.values() if e.parent is not None)
        for e in self._lru.values():
            assert e.children == built[e.tokens]
            if e.parent is not None:  # its parent: present, a prefix, and more recent
                p = self._lru[e.parent]
                assert e.tokens[:len(p.tokens)] == p.tokens and order[p.tokens] > order[e.tokens]
                assert e.depth == p.depth + 1 < MAX_CHAIN


class PrefixCache:
    """RAM in front of SSD (either may be absent). A lookup takes the longer of the two
    prefixes; an SSD hit is promoted into RAM. Every entry stored goes to both tiers (the
    SSD write happens on its own thread), so prefixes survive restarts."""

    def __init__(self, ram: RamTier | None = None, ssd=None):
        self.ram, self.ssd = ram, ssd
        self.hit_chain: frozenset = frozenset()
        self._to_disk: list[tuple[list[int], list]] = []  # serialized after the step

    def __len__(self) -> int:
        return len(self.ram) if self.ram is not None else 0

    @property
    def nbytes(self) -> int:
        return self.ram.nbytes if self.ram is not None else 0

    def lookup(self, tokens: list[int]) -> tuple[int, list | None]:
        """(prefix length, a private copy of its cache); `hit_chain`: the RAM entries that
        copy's slots equal, bit for bit (for the row's later `insert`s)."""
        n, cache = self.ram.lookup(tokens) if self.ram is not None else (0, None)
        self.hit_chain = self.ram.hit_chain if self.ram is not None else frozenset()
        m = self.ssd.longest(tokens) if self.ssd is not None else 0
        entry = None
        if self.ssd is not None:  # or the first slots of a longer entry's (`SsdTier.shared`)
            if (cut := self.ssd.shared(tokens, max(m, n)))[0]:
                m, entry = cut
        if m > n:
            restored = self.ssd.load(tokens, m, entry)
            if restored is not None:
                self.hit_chain = frozenset()
                if self.ram is not None:
                    self.hit_chain = self.ram.insert(tokens[:m], copy.deepcopy(restored))
                return m, restored
        elif n and m == n:  # the same prefix is on SSD: it was used, keep it there too
            self.ssd.touch(tokens[:n])
        elif not n and self.ssd is not None:  # found in neither tier: the SSD's miss too
            self.ssd.misses += 1  # (as a failed load is; a RAM hit asks the SSD nothing)
        return n, cache

    def insert(self, tokens: list[int], cache: list, limit: int | None = None,
               live: bool = False, durable: bool = True,
               trusted: frozenset = frozenset()) -> frozenset:
        """`live`: the cache goes on being filled (a checkpoint mid-prefill): store a
        snapshot. `durable`: also write it to SSD (a blob holds what its prefix adds to
        the stored prefix it extends, or all of it: only the entries worth a restart go
        there). Serializing for the SSD waits for `flush()`, after the step's tokens are
        out, so it never delays a first token. `trusted` and the return: `RamTier.insert`."""
        if live:
            cache = snapshot(cache)
        if self.ssd is not None and durable:
            materialize(cache)
            self._to_disk.append((list(tokens), cache))
        if self.ram is not None:
            return self.ram.insert(tokens, cache, limit, trusted)
        return frozenset()

    @property
    def pending_bytes(self) -> int:
        """Copies waiting for the SSD writer: memory under the same ceiling as the RAM tier."""
        return self.ssd.pending_bytes if self.ssd is not None else 0

    def step_started(self) -> None:
        """The engine started a step (SSD writes wait while it runs)."""
        if self.ssd is not None:
            self.ssd.step_started()

    def flush(self, room: int | None = None) -> None:
        """Hand this step's new entries to the SSD writer (serialization is MLX work).
        `room`: bytes its pending copies may hold in all (beyond that, entries are skipped)."""
        self.ssd.note_step()
        pending, self._to_disk = self._to_disk, []
        for tokens, cache in pending:
            self.ssd.put(tokens, cache, room)

    def trim(self, limit: int) -> None:
        if self.ram is not None:
            self.ram.trim(limit)

    def close(self) -> None:
        if self.ssd is not None:
            self.flush()
            self.ssd.close()

    def stats(self) -> dict:
        out = {}
        if self.ram is not None:
            out["ram"] = {**self.ram.stats.__dict__, "entries": len(self.ram),
                          "bytes": self.ram.nbytes, "cap_bytes": self.ram.cap_bytes}
        if self.ssd is not None:
            out["ssd"] = self.ssd.stats()
        return out

    def check_integrity(self) -> None:
        if self.ram is not None:
            self.ram.check_integrity()
        if self.ssd is not None:
            self.ssd.check_integrity()
