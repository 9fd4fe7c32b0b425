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
	$(BIN)/nobackfill demo --json runs/demo/report.json

# every benchmark in its quick mode (each writes JSON + a table/plot under runs/bench/)
bench: $(STAMP)
	$(BIN)/nobackfill bench encode --json runs/bench/encode.json
	$(BIN)/nobackfill bench world --json runs/bench/world.json
	$(BIN)/nobackfill bench xbt --quick --json runs/bench/quick/xbt.json
	$(BIN)/nobackfill bench xbt-text --json runs/bench/xbt_text.json
	$(BIN)/nobackfill bench compat-steps --steps 2,5,10 --quick --json runs/bench/quick/compat_steps.json
	$(BIN)/nobackfill bench lingual-text --quick --jobs 2 --json benchmarks/results/lingual_text.json
	$(BIN)/nobackfill bench lingual-world --quick --json runs/bench/quick/lingual_world.json
	$(BIN)/nobackfill bench reco --quick --json runs/bench/quick/reco.json
	$(BIN)/nobackfill bench late --quick --json runs/bench/quick/late.json
	$(BIN)/nobackfill bench routes --quick --json benchmarks/results/routes.json
	$(BIN)/nobackfill bench backfill --quick --json benchmarks/results/backfill.json
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
