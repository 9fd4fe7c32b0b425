# nobackfill — one command per job on a fresh machine.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup test demo bench bench-full clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# the suite, then the tests against a real Milvus server, in a loopback-only network namespace
test: $(STAMP)
	$(BIN)/python -m pytest -x -p no:cacheprovider -m "not milvus_server"
	sh scripts/isolated.sh $(BIN)/python -m pytest -x -p no:cacheprovider -m milvus_server

demo: $(STAMP)
	$(BIN)/nobackfill demo

# every benchmark in its quick mode; each writes JSON + a table (and plots) under benchmarks/results/,
# committed, and the README's tables are regenerated from them
R := benchmarks/results
bench: $(STAMP)
	$(BIN)/nobackfill bench encode --json $(R)/encode.json
	$(BIN)/nobackfill bench world --n 10000 --json $(R)/world.json
	$(BIN)/nobackfill bench xbt --quick --json $(R)/xbt.json
	$(BIN)/nobackfill bench xbt-text --quick --json $(R)/xbt_text.json
	$(BIN)/nobackfill bench compat-steps --steps 2,5,10 --quick --json $(R)/compat_steps.json
	$(BIN)/nobackfill bench lingual-text --quick --json $(R)/lingual_text.json
	$(BIN)/nobackfill bench lingual-world --quick --json $(R)/lingual_world.json
	$(BIN)/nobackfill bench reco --quick --json $(R)/reco.json
	$(BIN)/nobackfill bench late --quick --json $(R)/late.json
	$(BIN)/nobackfill bench routes --quick --json $(R)/routes.json
	$(BIN)/nobackfill bench backfill --quick --json $(R)/backfill.json
	$(BIN)/nobackfill bench serve --quick --json $(R)/serve.json
	sh scripts/isolated.sh $(BIN)/nobackfill bench store --quick --json $(R)/store.json
	$(BIN)/python scripts/readme_tables.py

# the reported (long) runs: hours on 2 cores
bench-full: $(STAMP)
	$(BIN)/nobackfill bench xbt --seeds 3 --json runs/bench/xbt.json
	$(BIN)/nobackfill bench compat-steps --steps 2,5,10 --json runs/bench/compat_steps.json
	$(BIN)/nobackfill bench lingual-text --json runs/bench/lingual_text.json
	$(BIN)/nobackfill bench lingual-world --json runs/bench/lingual_world.json
	$(BIN)/nobackfill bench reco --json runs/bench/reco.json
	$(BIN)/nobackfill bench late --json runs/bench/late.json

clean:
	rm -rf runs/demo runs/bench
