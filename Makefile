# nobackfill — one command per job on a fresh machine.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup test demo bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -x -p no:cacheprovider

demo: $(STAMP)
	$(BIN)/nobackfill demo --json runs/demo/report.json

bench: $(STAMP)
	$(BIN)/nobackfill bench encode --json runs/bench/encode.json

clean:
	rm -rf runs/demo runs/bench
