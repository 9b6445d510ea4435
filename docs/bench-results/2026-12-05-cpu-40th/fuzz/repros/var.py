import json, sys, copy, re
sys.path.insert(0, "/tmp/fuzz40")
from fuzzcore import check
src = open("/tmp/fuzz40/repros/seed400150-min.py").read()
CASE = json.loads(re.search(r"json.loads\('(.*)'\)", src).group(1))
def run(tag, f):
    c = copy.deepcopy(CASE); f(c)
    st, info = check(c)
    print(tag, st, info if isinstance(info, str) else info.get("diffs"), flush=True)
run("as is", lambda c: None)
run("no rep", lambda c: c["rounds"][0][0].pop("rep"))
run("mt 28", lambda c: c["rounds"][0][0].update(max_tokens=28))
run("mt 35", lambda c: c["rounds"][0][0].update(max_tokens=35))
run("r5 mt 1", lambda c: c["rounds"][0][1].update(max_tokens=1))
run("r5 mt 10", lambda c: c["rounds"][0][1].update(max_tokens=10))
run("no checkpoints", lambda c: c["rounds"][0][0].update(checkpoints=[]))
run("seed 46", lambda c: c["rounds"][0][0].update(seed=46))
