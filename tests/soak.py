"""A bounded soak (issue 15, item 10). Not part of the suite: `python tests/soak.py [MINUTES]
[CLIENTS] [-- appliance overrides ...]`.

Starts the real `appliance` CLI (default `+profile=agent-fleet`, an SSD tier in a temporary
directory), then CLIENTS agents loop for MINUTES: each turn shares one long system prompt,
streams or not, cancels one request in eight mid-stream, and samples with a seed. At the end
64 seeded answers are re-run alone on the idle server and should come back identical (a
mixed-up response would not; on CPU ~1% part after a few tokens, where a sampled near-tie
falls the other way: a batched step and a lone one differ in their last bits, so the report
says where each parted); RSS and the caches' bytes are sampled every 30 s, and /stats is
printed at start and end.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

import httpx

SYSTEM = ("You are a careful Python coding agent. Keep functions small, name things plainly, "
          "and write tests first. ") * 12


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


async def agent(i: int, url: str, deadline: float, out: dict, rng: random.Random) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        turn = 0
        while time.monotonic() < deadline:
            turn += 1
            body = {"model": "appliance-tiny", "max_tokens": rng.randint(8, 48),
                    "temperature": 0.7, "seed": rng.randrange(1 << 30),
                    "messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": f"agent {i} turn {turn}: def f{i}("}]}
            stream, cancel = rng.random() < 0.5, rng.random() < 0.125
            try:
                if stream:
                    text = ""
                    async with c.stream("POST", "/v1/chat/completions",
                                        json={**body, "stream": True}) as r:
                        if r.status_code == 429:
                            out["throttled"] += 1
                            await asyncio.sleep(0.5)
                            continue
                        if r.status_code != 200:
                            out["errors"].append((r.status_code, (await r.aread())[:200]))
                            continue
                        async for line in r.aiter_lines():
                            if cancel and len(text) > 5:
                                out["cancelled"] += 1
                                break
                            if line.startswith("data: {"):
                                ev = json.loads(line[6:])
                                if "error" in ev:
                                    out["errors"].append(("stream", ev["error"]))
                                elif ev.get("choices"):
                                    text += ev["choices"][0]["delta"].get("content") or ""
                        else:
                            out["answers"].append((body, text))
                else:
                    r = await c.post("/v1/chat/completions", json=body)
                    if r.status_code == 429:
                        out["throttled"] += 1
                        await asyncio.sleep(0.5)
                        continue
                    if r.status_code != 200:
                        out["errors"].append((r.status_code, r.text[:200]))
                        continue
                    out["answers"].append((body, r.json()["choices"][0]["message"]["content"]))
            except Exception as e:  # a transport failure is an error too
                out["errors"].append(("exception", repr(e)[:200]))


async def main(minutes: float, clients: int, overrides: list[str]) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="soak-")
    args = ["appliance", *(overrides or ["+profile=agent-fleet"]), f"server.port={port}",
            f"cache.ssd.path={tmp}", "batch.max_queue=256"]
    log = open(os.path.join(tmp, "server.log"), "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        start = {"rss_mb": rss_mb(proc.pid), "stats": httpx.get(f"{url}/stats").json()}
        out = {"errors": [], "answers": [], "cancelled": 0, "throttled": 0}
        deadline = time.monotonic() + minutes * 60
        timeline = []

        async def sample() -> None:  # RSS and the caches every 30 s, to see them level off
            async with httpx.AsyncClient(base_url=url, timeout=30) as c:
                while time.monotonic() < deadline:
                    st = (await c.get("/stats")).json()
                    cache = st.get("cache") or {}
                    timeline.append({"s": round(minutes * 60 - (deadline - time.monotonic())),
                                     "rss_mb": round(rss_mb(proc.pid)),
                                     "ram_bytes": (cache.get("ram") or {}).get("bytes"),
                                     "ssd_pending_bytes": (cache.get("ssd") or {}).get(
                                         "pending_bytes"),
                                     "kv_bytes": st["kv_bytes"]})
                    await asyncio.sleep(30)

        await asyncio.gather(sample(), *(agent(i, url, deadline, out, random.Random(i))
                                         for i in range(clients)))
        mid = {"rss_mb": rss_mb(proc.pid), "stats": httpx.get(f"{url}/stats").json()}
        sample = random.Random(0).sample(out["answers"], min(64, len(out["answers"])))
        parted = []
        with httpx.Client(base_url=url, timeout=120) as c:  # alone now: same seed, same text
            for body, text in sample:
                again = c.post("/v1/chat/completions", json=body).json()
                again = again["choices"][0]["message"]["content"]
                if again != text:  # where they part: batched and lone steps differ in
                    # their last bits on CPU, so a sampled near-tie can part late in the text
                    pairs = enumerate(zip(text, again, strict=False))
                    parted.append(next((k for k, (x, y) in pairs if x != y),
                                       min(len(text), len(again))))
        return {"clients": clients, "minutes": minutes, "answers": len(out["answers"]),
                "cancelled": out["cancelled"], "throttled": out["throttled"],
                "errors": out["errors"][:20], "n_errors": len(out["errors"]),
                "rerun_alone": len(sample), "mixed_up": len(parted), "parted_at_char": parted,
                "timeline": timeline, "start": start, "end": mid}
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


if __name__ == "__main__":
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    result = asyncio.run(main(float(argv[0]) if argv else 10, int(argv[1]) if len(argv) > 1
                              else 64, rest))
    print(json.dumps(result, indent=1, default=str))
