import sys, json, copy
sys.path.insert(0, "/tmp/fuzz2")
from fuzzcore import check
import fuzz
base = json.loads(open(sys.argv[1]).read().split("CASE = json.loads(")[1].split(")\nstatus")[0].strip("'"))
def short(st, info):
    if st == "ok": return "ok"
    if isinstance(info, dict):
        d = info["diffs"][0]; g = (info.get("gaps") or [{}])
        return f"{st} row={d[0]} i={d[1]} {d[2]}->{d[3]} gap={g[0].get('gap') if g else None}"
    return st + " " + str(info).strip().splitlines()[-1][:120]
for model in ["tiny-gemma3", "tiny", "tiny-qwen3-next"]:
    txt = fuzz.text_ids(model)
    for n in [2, 3, 4, 5, 8, 17, 33]:
        for codec in (["turbo", "k8v4"] if model == "tiny" else ["turbo"]):
            res = []
            for s in range(4):
                c = copy.deepcopy(base); c["model"] = model
                c["scheme"] = {"codec": codec, "layers": [0,1,2,3,4,5], "start": 0}
                c["rounds"][0] = [{"name": "r0", "prompt": txt[s*9:s*9+n], "max_tokens": 3, "tick": 0}]
                st, info = check(c); res.append(short(st, info))
            print(model, codec, n, res, flush=True)
