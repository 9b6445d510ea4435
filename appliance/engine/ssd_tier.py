"""The SSD prefix tier: one safetensors blob per entry, diskcache as the index.

Layout: <cache.ssd.path>/<plan fingerprint>/{index/, blobs/}. The fingerprint
namespace means a process with another model, dtype or KV scheme never sees these
entries. The engine thread only takes a private, evaluated copy of an entry (a
device copy) and the safetensors tensors and header made from it; one writer thread
writes those bytes (temp file, fsync, rename, then the index row), so no request waits on
the disk. Only the engine thread runs MLX: the writer reads evaluated buffers through the
buffer protocol and writes the file itself, and the cache clear that follows a write on
CUDA is the engine's, at its next step. It starts a write once the engine has
been idle for QUIET_S (a step in progress, even a long prefill, is not idle), or the
entry has waited MAX_DEFER_S, or the queue is half full: serializing does not take
cores or memory bandwidth from a request. The copies waiting to be written
count against the same memory ceiling as the live rows and the RAM tier (an entry
whose copy does not fit is skipped). Blobs are checksummed (a crc32 per 16 MiB
chunk, in the index, so a restore verifies the chunks in parallel while MLX reads
the file) and verified before use: a corrupt, truncated or foreign blob is dropped
with one warning and never served. An entry that extends a stored one (the next turn of a
conversation over the last) is written as a delta: only its new tokens' KV, with the stored
one as its parent (KVCache layers only; a chain of at most MAX_CHAIN blobs). A hit reads the
chain and joins it (or the first slots of a longer entry's: `shared`); dropping or evicting
an entry drops the entries built on it, and eviction takes the least recently used leaves
first (a use refreshes the whole chain). On
CPU, writing each turn's whole prefix cost an agents run 3-13% (25th session): the bytes
written fall by about the number of turns. diskcache only indexes (cull_limit=0: its own
culling evicts blindly, see the tech brief); eviction is ours, least recently used
first under the byte cap, where a prefix served from the RAM tier counts as used
too. A full disk or an unwritable directory disables the tier with a warning;
serving goes on.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import queue
import threading
import time
from pathlib import Path

from appliance.engine import threads
from appliance.engine.prefix_cache import cut_from, joined, kv_only
from appliance.engine.ssd_blob import (
    _POOL,
    _frozen,
    _tensors,
    checksums,
    write_safetensors,
)
from appliance.engine.trie import TokenTrie

log = logging.getLogger(__name__)
MAX_PENDING = 8  # queued writes; beyond this new entries are skipped (their copies hold memory)
QUIET_S = 0.05  # a write starts once the engine has been idle for this long,
MAX_DEFER_S = 2.0  # or once it has waited this long, or the queue is half full
MAX_CHAIN = 32  # blobs a hit may read (an entry deeper than this is written whole)


def may_write(now: float, last_step: float, queued_at: float, backlog: int,
              closing: bool) -> bool:
    """Serializing a blob competes with the engine for cores (and for the GPU's memory
    traffic), so the writer waits for a quiet engine; under steady load it does not wait
    for ever (the queue is bounded and its entries hold memory)."""
    return (closing or backlog >= MAX_PENDING // 2 or now - last_step >= QUIET_S
            or now - queued_at >= MAX_DEFER_S)


def _claim(path: Path):
    """Lock the directory for this process (released on close or when the process ends, kill
    -9 included). A second server on it would delete the first's half-written blobs as crash
    leftovers at its start, and each would count the byte cap alone."""
    import fcntl

    f = open(path, "a")  # noqa: SIM115  (held open: the lock lives as long as the file)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise RuntimeError("another appliance process uses it; give each server its own "
                           "cache.ssd.path") from None
    return f


def _key(tokens) -> str:
    import array

    return hashlib.sha256(array.array("i", tokens).tobytes()).hexdigest()


class SsdTier:
    def __init__(self, root: str | Path, cap_bytes: int, fingerprint: str,
                 encoded_from: int = 0):
        """`encoded_from`: kv.start, where an encoded entry's first slots may be cut."""
        self.cap_bytes, self.fingerprint = cap_bytes, fingerprint
        self.encoded_from = encoded_from
        self.dir = Path(root).expanduser() / fingerprint
        self.disabled: str | None = None
        self.hits = self.misses = self.hit_tokens = self.evictions = self.writes = 0
        self.dropped = 0  # corrupt / foreign blobs found and removed
        self.skipped = 0  # not written: queue full, no memory for a copy, larger than the cap
        self._meta: dict[str, dict] = {}  # key -> {tokens, file, nbytes, crcs, used}
        self._trie = TokenTrie()
        self._queue: queue.Queue = queue.Queue()
        self._in_hand = 0  # entries the writer took off the queue and has not finished
        self._pending_bytes = 0  # held by copies queued or in hand, until written
        # key -> (tokens, depth, layers), until written
        self._queued: dict[str, tuple[list[int], int, int]] = {}
        self._touched: set[str] = set()  # keys used since their index row was written
        self._last_step, self._closing = 0.0, False
        self._clear_wanted = False  # the writer read device buffers (CUDA): see step_started
        import mlx.core as mx

        self._on_cuda = hasattr(mx, "cuda") and mx.cuda.is_available()
        self._lock = threading.Lock()  # _meta / _trie: engine thread reads, writer writes
        self._owner = None  # the open lock file: one process a directory
        try:
            import diskcache

            (self.dir / "blobs").mkdir(parents=True, exist_ok=True)
            self._owner = _claim(self.dir / "lock")
            probe = self.dir / "blobs" / ".probe"
            probe.write_bytes(b"ok")
            probe.unlink()
            self._index = diskcache.Cache(str(self.dir / "index"), eviction_policy="none",
                                          cull_limit=0, statistics=0, size_limit=2**62)
            self._load_index()
            self._log_opened()
        except Exception as e:  # unwritable, missing, in use, corrupt index: off, one warning
            self._disable(f"cannot use {self.dir}: {e}")
        self._writer_done = threads.start("ssd-writer", self._write_loop)

    # -- engine thread -------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(m["nbytes"] for m in self._meta.values())

    def backlog(self) -> int:
        return self._queue.qsize() + self._in_hand

    @property
    def pending_bytes(self) -> int:
        """Memory held by copies waiting to be written (it counts against the ceiling)."""
        return self._pending_bytes

    def step_started(self) -> None:
        """The engine is running a step: no write starts until it has gone quiet (one step
        can be a whole prefill of seconds, which is not quiet). On CUDA, a buffer the
        writer read was moved to managed memory: MLX's buffer cache must not hand it to
        the engine's next allocation (it would be paged back mid-request), so the engine
        clears that cache here when the writer asked for it."""
        self._last_step = math.inf
        if self._clear_wanted:
            import mlx.core as mx

            self._clear_wanted = False
            mx.clear_cache()

    def note_step(self) -> None:
        """The engine finished a step (writes wait for it to go quiet)."""
        self._last_step = time.monotonic()

    def longest(self, tokens: list[int]) -> int:
        """Length of the longest stored prefix of tokens[:-1] (0: none)."""
        with self._lock:
            return self._trie.longest(tokens[:-1])

    def shared(self, tokens: list[int], floor: int) -> tuple[int, list[int] | None]:
        """More than `floor` leading tokens of tokens[:-1] that a stored entry shares and
        goes on past, as RAM's lookup takes them (a re-sent prompt after a restart finds
        only its whole turn here): (n, that entry's tokens), or (0, None). Only where its
        first slots are that prefix (`cut_from`: KV layers; encoded rows past kv.start),
        and only where the blob holding the n-th token is used at least half: a few shared
        template tokens do not read another conversation's blob."""
        with self._lock:
            n, entry = self._trie.shared(tokens[:-1])
        if n <= floor or entry is None:
            return 0, None
        for _, meta in self._chain(_key(entry)):  # the entry first
            start, end = meta.get("start", 0), len(meta["tokens"])
            if start < n:  # (a delta holds KV layers only; "kv": a blob written before "cut")
                cut = meta.get("cut", 0 if meta.get("kv") or "parent" in meta else None)
                return (n, list(entry)) if cut is not None and n >= cut \
                    and 2 * (n - start) >= end - start else (0, None)
        return 0, None

    def load(self, tokens: list[int], n: int, entry: list[int] | None = None) -> list | None:
        """The cache stored for tokens[:n], verified (each blob of its chain, then joined);
        with `entry` (`shared`), the first n slots of that longer entry's, reading only the
        blobs they need. None (and a bad entry dropped, with the entries built on it) if any
        is bad."""
        chain = [(k, m) for k, m in reversed(self._chain(_key(entry or tokens[:n])))
                 if m.get("start", 0) < n]  # the root first, up to the blob holding n
        if not chain:
            self.misses += 1
            return None
        parts = []
        for k, meta in chain:
            part = self._read(k, meta)
            if part is None:
                self.misses += 1
                return None
            parts.append(part)
        if len(chain[-1][1]["tokens"]) > n:  # the first slots of the last blob read
            for c in parts[-1]:
                c.offset = n - chain[-1][1].get("start", 0)
        self.hits += 1
        self.hit_tokens += n
        self._touch(chain[-1][0])
        return parts[0] if len(parts) == 1 and entry is None else joined(parts, release=True)

    def _read(self, key: str, meta: dict) -> list | None:
        from appliance.engine.kv import load_blob

        path = self.dir / "blobs" / meta["file"]
        try:
            if path.stat().st_size != meta["nbytes"]:
                raise ValueError("length mismatch")
            verified = _POOL.submit(checksums, path, meta["nbytes"])  # while MLX reads it
            import mlx.core as mx

            cache, info = load_blob(str(path))
            mx.eval([c.state for c in cache])  # read now: the file may be evicted later
            if verified.result() != meta["crcs"]:
                raise ValueError("checksum mismatch")
            if info.get("fingerprint") != self.fingerprint \
                    or int(info.get("n_tokens", -1)) != len(meta["tokens"]) \
                    or int(info.get("start", 0)) != meta.get("start", 0):
                raise ValueError("the blob belongs to another plan or prefix")
        except Exception as e:
            self.dropped += 1
            log.warning("SSD prefix cache: dropping %s (%s)", path.name, e)
            # gone from the view now, so the prefix computed again is stored again; its
            # files go on the writer's thread, before that entry's write (one queue)
            self._queue.put(("drop", self._forget(key)))
            return None
        return cache

    def _chain(self, key: str) -> list[tuple[str, dict]]:
        """The entry and the ones it extends, itself first ([] if it or one is missing)."""
        chain = []
        with self._lock:
            while key is not None:
                meta = self._meta.get(key)
                if meta is None:
                    return []
                chain.append((key, meta))
                key = meta.get("parent")
        return chain

    def touch(self, tokens: list[int]) -> None:
        """The prefix was used (here or from the RAM tier): refresh its recency, so the
        prefixes every agent shares are the last to be evicted and survive a restart."""
        self._touch(_key(tokens))

    def _touch(self, key: str) -> None:
        """Refresh an entry and the ones it extends (so least recently used is a leaf)."""
        if self.disabled:
            return
        now = time.time()
        for k, meta in self._chain(key):
            meta["used"] = now
            self._touched.add(k)  # its index row is rewritten by the writer, later

    def put(self, tokens: list[int], cache: list, room: int | None = None) -> None:
        """Copy on the engine thread (a device copy), serialize and write on the writer's.
        `room`: bytes all pending copies may hold; an entry that does not fit is skipped."""
        if self.disabled or not tokens:
            return
        key = _key(tokens)
        if key in self._meta:
            return self._touch(key)
        if key in self._queued:
            return
        parent, start, depth = self._base(tokens, cache)
        nbytes = sum(c.nbytes for c in cache) * (len(tokens) - start) // len(tokens)
        if (self._queue.qsize() >= MAX_PENDING  # the disk is slower than the traffic
                or (room is not None and self.pending_bytes + nbytes > room)):
            self.skipped += 1
            return
        try:
            frozen = _tensors(_frozen(cache, start), {"fingerprint": self.fingerprint,
                                                      "n_tokens": str(len(tokens)),
                                                      "start": str(start)})
        except Exception as e:  # e.g. no memory for the copy right now: skip this entry
            self.skipped += 1
            log.warning("SSD prefix cache: skipping an entry (%s: %s)", type(e).__name__, e)
            return
        with self._lock:
            self._pending_bytes += nbytes
        self._queued[key] = (list(tokens), depth, len(cache))
        self._queue.put(("put", key, list(tokens), frozen, time.monotonic(), nbytes, parent,
                         len(cache), cut_from(cache, self.encoded_from)))

    def _base(self, tokens: list[int], cache: list) -> tuple[str | None, int, int]:
        """The entry this one extends, its length, and this one's depth in the chain: the
        longest prefix stored or queued (a queued one is written first: one queue), where
        every layer is a KVCache (its slots are the tokens) and the chain stays short.
        (None, 0, 0): write the entry whole. (A turn that ends before the shared system
        prompt's blob has landed extends the queued prompt: an agents run on CPU wrote
        156-162 MB with this, 178-200 MB without.) Only over an entry of as many layers: with
        a draft, a solo row's entry holds the model's layers, a batched row's the drafter's
        too (`solo.py`)."""
        if not kv_only(cache):
            return None, 0, 0
        n = len(cache)
        with self._lock:
            m = self._trie.longest(tokens[:-1])
            meta = self._meta.get(_key(tokens[:m])) if m else None
        depth = meta.get("depth", 0) if meta and meta.get("layers", n) in (n, None) else -1
        for toks, d, layers in list(self._queued.values()):
            if layers == n and m < len(toks) < len(tokens) and tokens[:len(toks)] == toks:
                m, depth = len(toks), d
        if depth < 0 or depth + 1 >= MAX_CHAIN:
            return None, 0, 0
        return _key(tokens[:m]), m, depth + 1

    def close(self) -> None:
        """Finish pending writes (graceful shutdown), then stop the writer."""
        t, pending = time.perf_counter(), self.backlog()
        self._closing = True
        self._queue.put(("stop",))
        self._writer_done.wait()
        if self._owner is not None:
            self._owner.close()  # (releases the lock)
        log.info("SSD prefix cache closed: %d entries on disk; %d pending writes finished "
                 "in %.1f s", len(self._meta), pending, time.perf_counter() - t)

    def check_integrity(self) -> None:
        assert self.disabled or self.nbytes <= self.cap_bytes
        assert all(self._chain(k) for k in list(self._meta))  # every base is there

    # -- writer thread -------------------------------------------------------------
    def _write_loop(self) -> None:
        on_cuda = self._on_cuda
        try:  # Linux threads have their own nice value: compute for requests comes first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while True:
            item = self._queue.get()
            try:
                if not self.disabled:
                    self._persist_recency()
                    if item[0] == "put":
                        self._in_hand = 1
                        while not may_write(time.monotonic(), self._last_step, item[4],
                                            self._queue.qsize(), self._closing):
                            time.sleep(QUIET_S / 2)
                        t = time.monotonic()
                        self._write(*item[1:4], parent=item[6], layers=item[7], cut=item[8])
                        log.debug("SSD prefix cache: wrote %d tokens (%d bytes) in %.3f s, "
                                  "%.3f s after it was queued", len(item[2]), item[5],
                                  time.monotonic() - t, t - item[4])
                    elif item[0] == "drop":
                        self._delete(item[1])
            except Exception as e:  # full disk (MLX raises RuntimeError for a failed write),
                # permissions, a broken index: off with a warning, serving goes on, and the
                # writer goes on draining the queue (its copies hold memory)
                self._disable(f"write failed: {type(e).__name__}: {e}")
            finally:
                self._in_hand = 0
                if item[0] == "put":
                    self._queued.pop(item[1], None)
                    with self._lock:
                        self._pending_bytes -= item[5]
            if item[0] == "stop":
                return
            if item[0] == "put" and on_cuda:
                item = None  # its buffer was read on the host: the engine clears the cache
                self._clear_wanted = True

    def _write(self, key: str, tokens: list[int], blob, parent: str | None = None,
               layers: int | None = None, cut: int | None = None) -> None:
        name = f"{key}.safetensors"
        final, tmp = self.dir / "blobs" / name, self.dir / "blobs" / f".tmp-{name}"
        base = self._chain(parent) if parent else []
        if parent and not base:  # the entry it extends went meanwhile (evicted, dropped)
            self.skipped += 1
            return
        try:
            write_safetensors(tmp, *blob)
            size = tmp.stat().st_size
            if size > self.cap_bytes:  # (larger than the whole tier: never written)
                self.skipped += 1
                return tmp.unlink()
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            crcs = checksums(tmp, size, parallel=False)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        keep = {k for k, _ in base}  # (the entry's own chain is not evicted for it)
        while self.nbytes + size > self.cap_bytes:
            others = [k for k in self._meta if k not in keep]
            if not others:
                self.skipped += 1
                return tmp.unlink()
            self.evictions += self._remove(min(others, key=lambda k: self._meta[k]["used"]))
        os.replace(tmp, final)
        meta = {"tokens": tokens, "file": name, "nbytes": size, "crcs": crcs,
                "used": time.time(), "layers": layers, "cut": cut}
        if parent:
            meta.update(parent=parent, start=len(base[0][1]["tokens"]),
                        depth=base[0][1].get("depth", 0) + 1)
        with self._lock:
            based = not parent or parent in self._meta  # (a hit may have dropped it since)
            if based:
                self._meta[key] = meta
                self._trie.add(tokens)
        if not based:
            self.skipped += 1
            return final.unlink(missing_ok=True)
        self._index.set(key, meta)
        self._touch(key)
        self.writes += 1

    def _persist_recency(self) -> None:
        """Index rows of the entries used since the last write (recency survives a restart)."""
        while self._touched:
            key = self._touched.pop()
            with self._lock:
                meta = self._meta.get(key)
            if meta is not None and not self.disabled:
                self._index.set(key, meta)

    def _remove(self, key: str) -> int:
        """Remove an entry and the entries built on it; how many there were."""
        gone = self._forget(key)
        self._delete(gone)
        return len(gone)

    def _forget(self, key: str) -> list[tuple[str, dict]]:
        """Take an entry and the entries built on it out of the in-memory view."""
        with self._lock:
            doomed = [key]
            for k in doomed:  # (grows as it goes: breadth first)
                doomed += [c for c, m in self._meta.items() if m.get("parent") == k]
            gone = [(k, self._meta.pop(k)) for k in doomed if k in self._meta]
            for _, meta in gone:
                self._trie.remove(meta["tokens"])
        return gone

    def _delete(self, gone: list[tuple[str, dict]]) -> None:
        """The writer: their index rows and blobs."""
        for k, meta in gone:
            self._index.delete(k)
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
        orphans = [k for k in self._meta if not self._chain(k)]  # a base lost in a crash
        for k in orphans:
            self._index.delete(k)
            self._meta.pop(k)
        for meta in self._meta.values():
            self._trie.add(meta["tokens"])
        known = {m["file"] for m in self._meta.values()}
        for f in (self.dir / "blobs").iterdir():  # crash leftovers
            if f.name not in known:
                f.unlink(missing_ok=True)

    def _log_opened(self) -> None:
        """Say what a restart finds, and whether other plans' entries sit here unused (a
        changed model, dtype or KV scheme starts cold: said, not silent)."""
        from appliance.plan.sizes import format_size

        others = [p for p in self.dir.parent.iterdir()
                  if p.is_dir() and p.name.startswith("fp_") and p != self.dir]
        log.info("SSD prefix cache %s: %d entries, %s of %s%s", self.dir, len(self._meta),
                 format_size(self.nbytes), format_size(self.cap_bytes),
                 f"; {len(others)} other plan(s) have entries here that this plan cannot use"
                 if others else "")

    def _disable(self, why: str) -> None:
        if not self.disabled:
            log.warning("SSD prefix cache disabled: %s; serving goes on without it", why)
        self.disabled = why

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "hit_tokens": self.hit_tokens,
                "entries": len(self._meta), "path": str(self.dir), "bytes": self.nbytes,
                "cap_bytes": self.cap_bytes,
                "evictions": self.evictions, "writes": self.writes, "dropped": self.dropped,
                "skipped": self.skipped,
                "write_backlog": self.backlog(), "pending_bytes": self.pending_bytes,
                "disabled": self.disabled}
