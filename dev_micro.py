"""One-off: where does an SSD restore's time go on this machine (256 MiB / 1 GiB blobs)."""
import json, os, struct, sys, time, zlib
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import mlx.core as mx

CHUNK = 16 << 20
pool = ThreadPoolExecutor(16)

def t(label, fn, n=4):
    fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); ts.append((time.perf_counter() - t0) * 1000)
    print(f"{label:40s}", [round(x, 1) for x in ts], flush=True)

def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return 8 + n, json.loads(f.read(n))

def read_parallel(path, size, crc=True):
    buf = np.empty(size, np.uint8)
    mv = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    def one(off):
        n = os.preadv(fd, [mv[off:off + CHUNK]], off)
        return zlib.crc32(mv[off:off + n]) if crc else 0
    crcs = list(pool.map(one, range(0, size, CHUNK)))
    os.close(fd)
    return buf, crcs

def to_mx(buf, base, hdr):
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]
        arr = mx.array(buf[base + a: base + b].view(np.uint16)).view(mx.bfloat16).reshape(v["shape"])
        out[k] = arr
    mx.eval(list(out.values()))
    return out

for tokens in (2048, 8192):
  for layers, label in ((16, "1B"), (32, "8B")):
    hd = 64 if label == "1B" else 128
    arrays = {f"{i}.{kv}": mx.random.normal((1, 8, tokens, hd)).astype(mx.bfloat16)
              for i in range(layers) for kv in "kv"}
    mx.eval(arrays)
    path = f"/tmp/blob-{label}-{tokens}.safetensors"
    mx.save_safetensors(path, arrays, metadata={"a": "b"})
    size = os.path.getsize(path)
    base, hdr = header(path)
    print(f"== {label} {tokens} tokens: {size / 2**20:.0f} MiB", flush=True)
    t("mx.load + eval", lambda: mx.eval(list(mx.load(path).values())))
    fd = os.open(path, os.O_RDONLY)
    t("crc parallel (pread per chunk)", lambda: list(pool.map(lambda o: zlib.crc32(os.pread(fd, CHUNK, o)), range(0, size, CHUNK))))
    t("read parallel, no crc", lambda: read_parallel(path, size, crc=False))
    t("read parallel + crc", lambda: read_parallel(path, size))
    buf, _ = read_parallel(path, size)
    t("numpy buf -> mx arrays + eval", lambda: to_mx(buf, base, hdr))
    t("read+crc+to_mx (all)", lambda: to_mx(read_parallel(path, size)[0], base, hdr))
    vals = list(arrays.values())
    t("device copy (mx.contiguous of copies)", lambda: mx.eval([mx.array(a) * 1 for a in vals]))
    os.close(fd)
    os.remove(path)
