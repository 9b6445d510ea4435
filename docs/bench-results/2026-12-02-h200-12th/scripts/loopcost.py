"""Event-loop thread CPU per streamed token: a real appliance server, 16 concurrent
streams x 64 tokens x 3 rounds; reads the main thread's utime+stime from /proc."""
import asyncio, os, subprocess, sys, time, json
import httpx

port = int(sys.argv[1]); env = dict(os.environ)
p = subprocess.Popen([sys.executable, "-m", "appliance.cli", "mode=serve", f"server.port={port}"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
url = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        if httpx.get(url + "/health").status_code == 200: break
    except Exception: pass
    time.sleep(0.2)
model = httpx.get(url + "/v1/models").json()["data"][0]["id"]

def cpu(tid):
    f = open(f"/proc/{p.pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

async def one(c, i):
    body = {"model": model, "stream": True, "max_tokens": 64, "temperature": 0,
            "messages": [{"role": "user", "content": f"Write code number {i}."}],
            "logit_bias": {}}
    n = 0
    async with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"): n += 1
    return n

async def main():
    async with httpx.AsyncClient(timeout=120) as c:
        await one(c, -1)
        t0, w0 = cpu(p.pid), time.perf_counter()
        n = 0
        for k in range(3):
            n += sum(await asyncio.gather(*(one(c, 100 * k + i) for i in range(16))))
        return n, cpu(p.pid) - t0, time.perf_counter() - w0
n, c, w = asyncio.run(main())
print(json.dumps({"chunks": n, "main_thread_cpu_s": round(c, 3), "us_per_chunk": round(1e6 * c / n), "wall_s": round(w, 2)}))
p.terminate(); p.wait()
