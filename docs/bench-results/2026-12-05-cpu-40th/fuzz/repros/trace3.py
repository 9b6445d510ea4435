import json, sys, re, copy
sys.path.insert(0, "/tmp/fuzz40")
import fuzzcore
src = open("/tmp/fuzz40/repros/seed400150-min.py").read()
CASE = json.loads(re.search(r"json.loads\('(.*)'\)", src).group(1))
def plain(c, spec=False):
    c = json.loads(json.dumps(c)); c["_plain_outs"] = []
    out = fuzzcore.execute(c, spec)
    return out["r1"]["tokens"][26:], out.get("r5", {}).get("tokens")
print("plain", plain(CASE))
print("plain again", plain(CASE))
c = copy.deepcopy(CASE); c["rounds"][0] = c["rounds"][0][:1]
print("r1 alone", plain(c))
for mt in (1, 3, 10):
    c = copy.deepcopy(CASE); c["rounds"][0][1]["max_tokens"] = mt
    print("r5 mt", mt, plain(c))
c = copy.deepcopy(CASE); c["max_rows"] = 1
print("max_rows 1", plain(c))
