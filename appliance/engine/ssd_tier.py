"""The SSD prefix tier: one safetensors blob per entry, diskcache as the index.

Layout: <cache.ssd.path>/<plan fingerprint>/{index/, blobs/}. The fingerprint
namespace means a process with another model, dtype or KV scheme never sees
these entries. Blobs are written off the request path by one writer thread
(temp file, fsync, rename, then the index row), checksummed (crc32 in the
index) and verified before use: a corrupt, truncated or foreign blob is
dropped with one warning and never served. diskcache only indexes (cull_limit=0:
its own culling evicts blindly, see the tech brief); eviction is ours, least
recently used first, under the byte cap. A full disk or an unwritable
directory disables the tier with a warning; serving goes on.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import queue
import threading
import time
import zlib
from pathlib import Path

from appliance.engine.prefix_cache import TokenTrie

log = logging.getLogger(__name__)


def _trimmed(c):
    """A KVCache's state is its whole buffer (grown 256 slots at a time): persist only the
    `offset` tokens that hold data. Other layer kinds are saved as they are."""
    from mlx_lm.models.cache import KVCache

    if type(c) is not KVCache or c.keys is None or c.keys.shape[2] == c.offset:
        return c
    t = KVCache()
    t.keys, t.values, t.offset = c.keys[..., :c.offset, :], c.values[..., :c.offset, :], c.offset
    return t


def _key(tokens) -> str:
    import array

    return hashlib.sha256(array.array("i", tokens).tobytes()).hexdigest()


class SsdTier:
    def __init__(self, root: str | Path, cap_bytes: int, fingerprint: str):
        self.cap_bytes, self.fingerprint = cap_bytes, fingerprint
        self.dir = Path(root).expanduser() / fingerprint
        self.disabled: str | None = None
        self.hits = self.misses = self.hit_tokens = self.evictions = self.writes = 0
        self.dropped = 0  # corrupt / foreign blobs found and removed
        self._meta: dict[str, dict] = {}  # key -> {tokens, file, nbytes, crc, used}
        self._trie = TokenTrie()
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # _meta / _trie: engine thread reads, writer writes
        try:
            import diskcache

            (self.dir / "blobs").mkdir(parents=True, exist_ok=True)
            probe = self.dir / "blobs" / ".probe"
            probe.write_bytes(b"ok")
            probe.unlink()
            self._index = diskcache.Cache(str(self.dir / "index"), eviction_policy="none",
                                          cull_limit=0, statistics=0, size_limit=2**62)
            self._load_index()
        except Exception as e:  # unwritable, missing, corrupt index: off, with one warning
            self._disable(f"cannot use {self.dir}: {e}")
        self._writer = threading.Thread(target=self._write_loop, name="ssd-writer", daemon=True)
        self._writer.start()

    # -- engine thread -------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(m["nbytes"] for m in self._meta.values())

    def backlog(self) -> int:
        return self._queue.qsize()

    def longest(self, tokens: list[int]) -> int:
        """Length of the longest stored prefix of tokens[:-1] (0: none)."""
        with self._lock:
            return self._trie.longest(tokens[:-1])

    def load(self, tokens: list[int], n: int) -> list | None:
        """The cache stored for tokens[:n], verified; None (and the entry dropped) if bad."""
        from mlx_lm.models.cache import load_prompt_cache

        key = _key(tokens[:n])
        meta = self._meta.get(key)
        if meta is None:
            self.misses += 1
            return None
        path = self.dir / "blobs" / meta["file"]
        try:
            data = path.read_bytes()
            if len(data) != meta["nbytes"] or zlib.crc32(data) != meta["crc"]:
                raise ValueError("checksum or length mismatch")
            cache, info = load_prompt_cache(str(path), return_metadata=True)
            if info.get("fingerprint") != self.fingerprint or int(info.get("n_tokens", -1)) != n:
                raise ValueError("the blob belongs to another plan or prefix")
            import mlx.core as mx

            mx.eval([c.state for c in cache])  # read now: the file may be evicted later
        except Exception as e:
            self.dropped += 1
            self.misses += 1
            log.warning("SSD prefix cache: dropping %s (%s)", path.name, e)
            self._queue.put(("drop", key))
            return None
        self.hits += 1
        self.hit_tokens += n
        meta["used"] = time.time()
        return cache

    def put(self, tokens: list[int], cache: list) -> None:
        """Serialize on the engine thread (MLX), write on the writer thread (disk)."""
        if self.disabled or not tokens:
            return
        from mlx_lm.models.cache import save_prompt_cache

        key = _key(tokens)
        if key in self._meta:
            self._meta[key]["used"] = time.time()
            return
        buf = io.BytesIO()
        save_prompt_cache(buf, [_trimmed(c) for c in cache],
                          {"fingerprint": self.fingerprint, "n_tokens": str(len(tokens))})
        self._queue.put(("put", key, list(tokens), buf.getvalue()))

    def close(self) -> None:
        """Finish pending writes (graceful shutdown), then stop the writer."""
        self._queue.put(("stop",))
        self._writer.join()

    def check_integrity(self) -> None:
        assert self.disabled or self.nbytes <= self.cap_bytes

    # -- writer thread -------------------------------------------------------------
    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item[0] == "stop":
                return
            if self.disabled:
                continue
            try:
                if item[0] == "put":
                    self._write(*item[1:])
                elif item[0] == "drop":
                    self._remove(item[1])
            except OSError as e:  # full disk, permissions: off, serving goes on
                self._disable(f"write failed: {e}")

    def _write(self, key: str, tokens: list[int], data: bytes) -> None:
        if len(data) > self.cap_bytes:
            return
        while self._meta and self.nbytes + len(data) > self.cap_bytes:
            oldest = min(self._meta, key=lambda k: self._meta[k]["used"])
            self._remove(oldest)
            self.evictions += 1
        name = f"{key}.safetensors"
        final, tmp = self.dir / "blobs" / name, self.dir / "blobs" / f".{name}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        meta = {"tokens": tokens, "file": name, "nbytes": len(data), "crc": zlib.crc32(data),
                "used": time.time()}
        self._index.set(key, meta)
        with self._lock:
            self._meta[key] = meta
            self._trie.add(tokens)
        self.writes += 1

    def _remove(self, key: str) -> None:
        with self._lock:
            meta = self._meta.pop(key, None)
            if meta is not None:
                self._trie.remove(meta["tokens"])
        self._index.delete(key)
        if meta is not None:
            (self.dir / "blobs" / meta["file"]).unlink(missing_ok=True)

    # -- bookkeeping ---------------------------------------------------------------
    def _load_index(self) -> None:
        """Rebuild the in-memory view from the index; delete blobs it does not know."""
        for key in list(self._index):
            meta = self._index.get(key)
            if not isinstance(meta, dict) or not (self.dir / "blobs" / meta["file"]).exists():
                self._index.delete(key)
                continue
            self._meta[key] = meta
            self._trie.add(meta["tokens"])
        known = {m["file"] for m in self._meta.values()}
        for f in (self.dir / "blobs").iterdir():  # crash leftovers
            if f.name not in known:
                f.unlink(missing_ok=True)

    def _disable(self, why: str) -> None:
        if not self.disabled:
            log.warning("SSD prefix cache disabled: %s; serving goes on without it", why)
        self.disabled = why

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "hit_tokens": self.hit_tokens,
                "entries": len(self._meta), "path": str(self.dir), "bytes": self.nbytes,
                "cap_bytes": self.cap_bytes,
                "evictions": self.evictions, "writes": self.writes, "dropped": self.dropped,
                "write_backlog": self.backlog(), "disabled": self.disabled}
