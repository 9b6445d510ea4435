# appliance: every recipe a person runs. `just --list` shows them.

# serve the embedded model (pass overrides: just serve +profile=agent-fleet server.port=9000)
serve *ARGS:
    appliance {{ARGS}}

# print the resolved execution plan
plan *ARGS:
    appliance mode=plan {{ARGS}}

# run the test suite (the same command CI runs)
test *ARGS:
    pytest -q {{ARGS}}

# lint and check formatting rules
lint:
    ruff check appliance tests

# measure once (bench=fleet|agents|decode|prefix|kv|spec); results in ./bench/<time>/
bench *ARGS:
    appliance mode=bench {{ARGS}}

# (each recipe's comment is one line: `just --list` shows the last line only)
# sweep and compare, e.g. just sweep batch.max_rows=1,4,8 -> ./multirun/<date>/<time>/sweep.md
sweep *ARGS:
    appliance -m mode=bench {{ARGS}}

# multi-turn coding agents: this plan, then mlx_lm.server, in one run (ratios)
bench-agents *ARGS:
    appliance mode=bench bench=agents {{ARGS}}

# issue 13's memory scenario (H200, 1B shape; old code answered HTTP 500 there; docs/memory.md)
bench-memory *ARGS:
    appliance mode=bench bench=agents model=synthetic model.shape=llama-3.2-1b \
        model.dtype=bfloat16 cache=ram batch.max_rows=16 cache.ram.bytes=32GiB \
        bench.anchor=none bench.agents=16 bench.turns=12 bench.system_tokens=4096 \
        bench.tool_tokens=1024 {{ARGS}}

# search batch/cache knobs on bench=agents (Optuna): just tune tune.profile=mine -> profiles/mine.yaml
tune *ARGS:
    appliance mode=tune {{ARGS}}

# regenerate goldens/<backend>/ from mlx-lm directly (only when the model or versions change)
goldens:
    python -m appliance.oracle

# retrain the embedded model (see docs/embedded-model.md)
train-tiny *ARGS:
    python -m appliance.embedded.train {{ARGS}}

# retrain the embedded model's MTP head -> appliance/embedded/tiny/mtp.safetensors
train-mtp *ARGS:
    python -m appliance.embedded.train_spec mtp {{ARGS}}

# retrain the embedded draft model -> appliance/embedded/draft/
train-draft *ARGS:
    python -m appliance.embedded.train_spec draft {{ARGS}}

# greedy acceptance of both drafters on held-out code (see docs/embedded-model.md)
spec-accept *ARGS:
    python -m appliance.embedded.train_spec accept {{ARGS}}
