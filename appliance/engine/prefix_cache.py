"""The prefix cache: a RAM tier (trie + LRU by bytes) in front of an optional SSD tier.

Entries are per-layer cache objects (KVCache, RotatingKVCache, ArraysCache)
taken *exactly* at a token boundary (a checkpoint), so they are never
trimmed: that is what makes sliding-window and recurrent layers reusable.
A hit hands out a deep copy (the batch mutates what it is given) and
refreshes the entry's recency. Only the engine thread touches it.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, field

_END = -1  # trie key marking "an entry ends here"


class TokenTrie:
    """Token-id sequences, for longest-stored-prefix queries. Both tiers index with it."""

    def __init__(self):
        self._root: dict = {}

    def add(self, tokens) -> None:
        node = self._root
        for t in tokens:
            node = node.setdefault(t, {})
        node[_END] = True

    def remove(self, tokens) -> None:
        path, node = [], self._root
        for t in tokens:
            if t not in node:
                return
            path.append((node, t))
            node = node[t]
        node.pop(_END, None)
        for parent, t in reversed(path):  # prune branches that hold nothing any more
            if parent[t]:
                break
            del parent[t]

    def longest(self, tokens) -> int:
        """Length of the longest stored sequence that prefixes `tokens` (0: none)."""
        node, best = self._root, 0
        for i, t in enumerate(tokens):
            node = node.get(t)
            if node is None:
                break
            if _END in node:
                best = i + 1
        return best

    def __len__(self) -> int:
        def count(node) -> int:
            return (_END in node) + sum(count(v) for k, v in node.items() if k != _END)

        return count(self._root)

    def empty(self) -> bool:
        return not self._root


def snapshot(cache: list) -> list:
    """A copy of a cache that goes on being filled, as cheap as is safe: a KVCache only
    ever writes past its offset (or into a new, larger buffer), so its arrays can be
    shared; other layer kinds (a wrapping window, recurrent state) are copied."""
    from mlx_lm.models.cache import KVCache

    return [copy.copy(c) if type(c) is KVCache else copy.deepcopy(c) for c in cache]


@dataclass
class TierStats:
    hits: int = 0
    misses: int = 0
    hit_tokens: int = 0
    inserts: int = 0
    evictions: int = 0


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    cache: list
    nbytes: int


@dataclass
class RamTier:
    """Prefix entries within `cap_bytes` (and within a moving `limit` the engine sets)."""

    cap_bytes: int
    stats: TierStats = field(default_factory=TierStats)
    _trie: TokenTrie = field(default_factory=TokenTrie)
    _lru: OrderedDict = field(default_factory=OrderedDict)  # tokens -> _Entry, oldest first
    nbytes: int = 0

    def __len__(self) -> int:
        return len(self._lru)

    def lookup(self, tokens: list[int]) -> tuple[int, list | None]:
        """The longest stored prefix of tokens[:-1] (one token must remain to run):
        (its length, a private copy of its cache), or (0, None)."""
        best = self._trie.longest(tokens[:-1])
        if not best:
            self.stats.misses += 1
            return 0, None
        key = tuple(tokens[:best])
        self._lru.move_to_end(key)  # a hit refreshes recency
        self.stats.hits += 1
        self.stats.hit_tokens += best
        return best, copy.deepcopy(self._lru[key].cache)

    def insert(self, tokens: list[int], cache: list, limit: int | None = None) -> None:
        """Store a checkpoint of `tokens` (replacing an equal one), then evict to fit."""
        key = tuple(tokens)
        if not key:
            return
        nbytes = sum(c.nbytes for c in cache)
        budget = self.cap_bytes if limit is None else min(self.cap_bytes, limit)
        if nbytes > budget:
            return  # would evict everything and still not fit
        if key in self._lru:
            self._remove(key)
        self._trie.add(key)
        self._lru[key] = _Entry(key, cache, nbytes)
        self.nbytes += nbytes
        self.stats.inserts += 1
        self.trim(budget)

    def trim(self, limit: int) -> None:
        """Evict least recently used entries until at most `limit` bytes are held."""
        while self._lru and self.nbytes > limit:
            self._remove(next(iter(self._lru)))
            self.stats.evictions += 1

    def _remove(self, key: tuple[int, ...]) -> None:
        entry = self._lru.pop(key)
        self.nbytes -= entry.nbytes
        self._trie.remove(key)

    def check_integrity(self) -> None:
        assert self.nbytes == sum(e.nbytes for e in self._lru.values())
        assert self.nbytes <= self.cap_bytes
        assert len(self._trie) == len(self._lru)


class PrefixCache:
    """RAM in front of SSD (either may be absent). A lookup takes the longer of the two
    prefixes; an SSD hit is promoted into RAM. Every entry stored goes to both tiers (the
    SSD write happens on its own thread), so prefixes survive restarts."""

    def __init__(self, ram: RamTier | None = None, ssd=None):
        self.ram, self.ssd = ram, ssd
        self._to_disk: list[tuple[list[int], list]] = []  # serialized after the step

    def __len__(self) -> int:
        return len(self.ram) if self.ram is not None else 0

    @property
    def nbytes(self) -> int:
        return self.ram.nbytes if self.ram is not None else 0

    def lookup(self, tokens: list[int]) -> tuple[int, list | None]:
        n, cache = self.ram.lookup(tokens) if self.ram is not None else (0, None)
        m = self.ssd.longest(tokens) if self.ssd is not None else 0
        if m > n:
            restored = self.ssd.load(tokens, m)
            if restored is not None:
                if self.ram is not None:
                    self.ram.insert(tokens[:m], copy.deepcopy(restored))
                return m, restored
        return n, cache

    def insert(self, tokens: list[int], cache: list, limit: int | None = None,
               live: bool = False, durable: bool = True) -> None:
        """`live`: the cache goes on being filled (a checkpoint mid-prefill): store a
        snapshot. `durable`: also write it to SSD (each blob holds its whole prefix, so
        only the entries worth a restart go there). Serializing for the SSD waits for
        `flush()`, after the step's tokens are out, so it never delays a first token."""
        if live:
            cache = snapshot(cache)
        if self.ssd is not None and durable:
            self._to_disk.append((list(tokens), cache))
        if self.ram is not None:
            self.ram.insert(tokens, cache, limit)

    def flush(self) -> None:
        """Hand this step's new entries to the SSD writer (serialization is MLX work)."""
        pending, self._to_disk = self._to_disk, []
        for tokens, cache in pending:
            self.ssd.put(tokens, cache)

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
