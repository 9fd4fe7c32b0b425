# nobackfill — one command per job on a fresh machine.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup test demo bench bench-full clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[dev]' -c constraints.txt
	touch $(STAMP)

setup: $(STAMP)

# the suite, and beside it the tests against a real Milvus server, in a loopback-only network namespace
test: $(STAMP)
	sh scripts/test.sh $(BIN)/python

demo: $(STAMP)
	$(BIN)/nobackfill demo

# every benchmark in its quick mode; each writes JSON + a table (and plots) under benchmarks/results/,
# committed, and the README's tables are regenerated from them
R := benchmarks/results
bench: $(STAMP)
	$(BIN)/nobackfill bench encode --out $(R)/encode.json
	$(BIN)/nobackfill bench world --n 10000 --out $(R)/world.json
	$(BIN)/nobackfill bench xbt --quick --out $(R)/xbt.json
	$(BIN)/nobackfill bench xbt-text --quick --out $(R)/xbt_text.json
	$(BIN)/nobackfill bench compat-steps --steps 2,5,10 --quick --out $(R)/compat_steps.json
	$(BIN)/nobackfill bench lingual-text --quick --jobs 2 --out $(R)/lingual_text.json
	$(BIN)/nobackfill bench lingual-text --quick --jobs 2 --out $(R)/lingual_text_baselines.json \
		--methods oewc,oewc_teir,er,er_teir,der,der_teir,lora,lora_teir,prompt,prompt_teir,cll_clip_oracle,cll_clip_teir_oracle
	$(BIN)/nobackfill bench lingual-world --quick --jobs 2 --out $(R)/lingual_world.json
	$(BIN)/nobackfill bench lingual-lambda --out $(R)/lingual_lambda_world.json
	$(BIN)/nobackfill bench lingual-lambda --data ../shared/data/multi30k --model minilm --langs de,fr,cs \
		--out $(R)/lingual_lambda_text.json
	$(BIN)/nobackfill bench reco --quick --out $(R)/reco.json
	$(BIN)/nobackfill bench late --quick --out $(R)/late.json
	$(BIN)/nobackfill bench routes --quick --out $(R)/routes.json
	$(BIN)/nobackfill bench backfill --quick --out $(R)/backfill.json
	$(BIN)/nobackfill bench backfill-engine --quick --out $(R)/backfill_engine.json
	$(BIN)/nobackfill bench fitted-bridge --quick --out $(R)/fitted_bridge.json
	$(BIN)/nobackfill bench serve --quick --out $(R)/serve.json
	sh scripts/isolated.sh $(BIN)/nobackfill bench store --quick --out $(R)/store.json
	$(BIN)/nobackfill bench scale --quick --out $(R)/scale.json
	$(BIN)/nobackfill bench import --quick --out $(R)/import.json
	sh scripts/isolated.sh $(BIN)/nobackfill bench import --quick --shared --set 'parts=["milvus_in_place"]' \
		--out $(R)/import_shared.json
	sh scripts/isolated.sh $(BIN)/nobackfill bench scale --quick --shared --set 'indexes=[]' --set 'peers=[]' \
		--out $(R)/scale_shared.json
	$(BIN)/nobackfill bench merged --out $(R)/merged.json
	$(BIN)/nobackfill bench tables

# the reported (long) runs: hours on 2 cores
bench-full: $(STAMP)
	$(BIN)/nobackfill bench xbt --seeds 3 --out runs/bench/xbt.json
	$(BIN)/nobackfill bench compat-steps --steps 2,5,10 --out runs/bench/compat_steps.json
	$(BIN)/nobackfill bench lingual-text --out runs/bench/lingual_text.json
	$(BIN)/nobackfill bench lingual-world --out runs/bench/lingual_world.json
	$(BIN)/nobackfill bench reco --out runs/bench/reco.json
	$(BIN)/nobackfill bench late --out runs/bench/late.json
	sh scripts/isolated.sh $(BIN)/nobackfill bench store --n 1000000 --datasets minilm,random --backends faiss:HNSW32 \
		--out $(R)/store_1m.json
	$(BIN)/nobackfill bench scale --sizes 1000000 --indexes HNSW32 --set 'peers=[]' --out $(R)/scale_1m.json
	$(BIN)/nobackfill bench import --sizes 1000000 --set 'parts=["throughput"]' --out $(R)/import_1m.json

clean:
	rm -rf runs/demo runs/bench
