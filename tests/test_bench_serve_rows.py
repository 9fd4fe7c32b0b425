"""The rows `bench serve` adds: the floor app (the same encoder and an exact faiss index behind one
route), one row from several turns of a load, and the tables of the latency and encoder rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from nobackfill.bench.serve_encoders import format_markdown as encoders_markdown
from nobackfill.bench.serve_latency import floor_app
from nobackfill.bench.serve_rows import _median_run, latency_markdown
from nobackfill.encoders import load_encoder

MODEL = Path(__file__).resolve().parents[1] / "models" / "world-old"


def test_the_floor_answers_with_the_encoder_and_an_exact_index():
    enc = load_encoder(MODEL)
    vectors = enc.encode_texts([f"a {c} circle" for c in ("red", "green", "blue", "yellow")] + ["a purple square"])
    api = TestClient(floor_app(str(MODEL), vectors))
    assert api.get("/healthz").json() == {"ok": True}
    hits = api.post("/v1/search", json={"text": "a blue circle", "k": 3}).json()["hits"]
    assert [h["row"] for h in hits][0] == 2 and len(hits) == 3
    want = (vectors @ enc.encode_texts(["a blue circle"])[0])
    assert abs(hits[0]["score"] - float(want.max())) < 1e-5
    assert api.post("/v1/search", json={"k": 3}).status_code == 422


def test_one_row_from_several_turns_is_their_median():
    turns = [{"concurrency": 8, "requests": 10, "errors": e, "p50_ms": p, "p99_ms": 3 * p, "rps": r}
             for e, p, r in ((0, 2.0, 100.0), (1, 9.0, 10.0), (0, 3.0, 80.0))]
    row = _median_run(turns)
    assert row == {"concurrency": 8, "requests": 30, "errors": 1, "p50_ms": 3.0, "p99_ms": 9.0, "rps": 80.0,
                   "turns": 3}


def test_the_tables_name_every_row():
    r = {"concurrency": 1, "requests": 3, "errors": 0, "p50_ms": 2.5, "p99_ms": 3.0, "rps": 400.0}
    lat = {"idle_c1": r, "idle_c8": {**r, "concurrency": 8}, "floor_c1": {**r, "p50_ms": 2.0},
           "floor_c8": r, "c1_p50_over_floor": 1.25, "c8_rps_over_floor": 1.0}
    md = latency_markdown(lat)
    assert "| floor: same encoder + faiss behind one FastAPI route | 1 | 3 | 0 | 2.0 |" in md and "1.25x" in md
    row = {"torch": {"batch_1_ms_per_query": 3.0, "batch_32_ms_per_query": 0.5},
           **{n: {"batch_1_ms_per_query": 1.5, "batch_32_ms_per_query": 0.5} for n in ("onnx_fp32", "onnx_int8")},
           "onnx_fp32_traced": {"batch_1_ms_per_query": 2.0, "batch_32_ms_per_query": 0.6}}
    lengths = [{"words": 3, "tokens": 5.2, "torch": 3.0, "onnx_fp32": 1.2, "onnx_int8": 0.6, "onnx_fp32_speedup": 2.5,
                "onnx_fp32_traced": 1.4},
               {"words": None, "tokens": 30.0, "torch": 3.0, "onnx_fp32": 1.5, "onnx_int8": 1.5, "onnx_fp32_speedup": 2.0,
                "onnx_fp32_traced": 2.0}]
    speed = {"graph": "clip-text", "max_abs_diff_fp32": 1e-7, "max_abs_diff_int8": 8e-3, "max_abs_diff_fp32_traced": 2e-7,
             "threads": 1, **row,
             "by_threads": {"1": {**row, "batch_1_by_length": lengths},
                            "2": {**row, "torch": {"batch_1_ms_per_query": 6.0, "batch_32_ms_per_query": 1.0},
                                  "onnx_fp32_spinning": {"batch_1_ms_per_query": 1.2, "batch_32_ms_per_query": 0.4},
                                  "batch_1_by_length": [{**lengths[1], "torch": 6.0, "onnx_fp32_spinning": 2.0,
                                                         "onnx_fp32_spinning_speedup": 3.0}]}}}
    recall = {k: {"torch": 0.5, "onnx_fp32": 0.5, "onnx_int8": 0.49, "int8_minus_torch": -0.01}
              for k in ("world_t2i", "multi30k_val_t2t")}
    md = encoders_markdown({"speed": speed, "int8_recall": recall})
    assert "| ONNX Runtime int8, CLIP text graph | 1 | 1.5 | 0.5 | 2.00x | 8.0e-03 |" in md and "-0.01" in md
    assert "| ONNX Runtime fp32, CLIP text graph | 2 | 1.5 | 0.5 | 4.00x | 1.0e-07 |" in md
    assert "| ONNX Runtime fp32, traced graph | 1 | 2.0 | 0.6 | 1.50x | 2.0e-07 |" in md
    assert "| torch | 2 | 6.0 | 1.0 | 1.00x | - |" in md
    assert "| first 3 words | 1 | 3 | 5.2 | 3.0 | 1.4 | 1.2 | 2.50x | - | 0.6 |" in md
    assert "| whole texts | 1 | - | 30.0 | 3.0 | 2.0 | 1.5 | 2.00x | - | 1.5 |" in md
    # on two threads, ONNX Runtime's idle threads also timed spinning, as torch's OpenMP threads do
    assert "| ONNX Runtime fp32, CLIP text graph, idle threads spinning (as torch's) | 2 | 1.2 | 0.4 | 5.00x |" in md
    assert "| whole texts | 2 | - | 30.0 | 6.0 | 2.0 | 1.5 | 2.00x | 2.0 (3.00x) | 1.5 |" in md
    assert "spinning (as torch's) | 1 |" not in md
    floor = {**speed, "by_threads": {"1": {**row, "onnx_fp32_products_only": {"batch_1_ms_per_query": 1.0,
                                                                              "batch_32_ms_per_query": 0.3}}}}
    md = encoders_markdown({"speed": floor, "int8_recall": recall})
    assert "| ONNX Runtime fp32, the weight products alone (a floor for any fp32 graph) | 1 | 1.0 | 0.3 | 3.00x | - |" in md
    old = encoders_markdown({"speed": {k: v for k, v in speed.items() if k not in ("graph", "max_abs_diff_fp32_traced")},
                             "int8_recall": recall})  # a result written before the traced row: no such row
    assert "| ONNX Runtime fp32, traced graph | 1 | 1.5 | 0.5 | 2.00x | 1.0e-07 |" in old and "| ONNX Runtime fp32, traced graph | 1 | 2.0" not in old


def test_the_tower_is_timed_by_query_length_on_the_same_texts_cut_short():
    """Each length is the first N words of the same texts; the whole texts reuse their batch-1 times."""
    from nobackfill.bench.serve_encoders import QUERY_WORDS, _by_length, _first_words

    assert _first_words(["a b c d", "e  f", ""], 2) == ["a b", "e f", ""]

    class Tok:
        def __call__(self, texts, truncation, max_length):
            return {"input_ids": [list(range(min(len(t.split()) + 2, max_length))) for t in texts]}

    enc = type("E", (), {"tokenizer": Tok(), "max_length": 8})()
    seen = []
    runs = {name: (lambda name: lambda b: seen.append((name, len(b[0].split()))))(name) for name in ("torch", "onnx_fp32")}
    texts = [" ".join(["w"] * 12)] * 3
    rows = _by_length(runs, enc, texts, 0.0, {"torch": 4.0, "onnx_fp32": 2.0})
    assert [r["words"] for r in rows] == [*QUERY_WORDS, None]
    assert [r["tokens"] for r in rows] == [min(w + 2, 8) for w in QUERY_WORDS] + [8]  # truncated as embedded
    assert rows[-1]["onnx_fp32_speedup"] == 2.0 and all(r["torch"] >= 0 for r in rows)
    assert {n for _, n in seen} == set(QUERY_WORDS)  # the whole texts were not timed again


def test_the_encoders_take_turns_block_by_block_on_the_same_batches():
    """Timed in turns of a few calls, each after a pause and an untimed call (another runtime's
    spinning threads park first), every encoder on the same batches."""
    from nobackfill.bench.serve_encoders import _ms_per_query

    calls = []
    encoders = {name: (lambda name: lambda b: calls.append((name, tuple(b))))(name) for name in ("a", "b")}
    got = _ms_per_query(encoders, [f"t{i}" for i in range(7)], batch=3, seconds=0.0, block=2, settle=0.0)
    assert set(got) == {"a", "b"} and all(v >= 0 for v in got.values())
    calls = calls[2:]  # the warm-ups
    turn = 1 + 2  # the untimed call, then the block
    assert [c[0] for c in calls] == (["a"] * turn + ["b"] * turn) * (len(calls) // (2 * turn)) and len(calls) >= 12
    a, b = calls[:turn], calls[turn:2 * turn]
    assert [c[1] for c in a] == [c[1] for c in b]  # the same batches, in turn
    assert a[1][1] == ("t0", "t1", "t2") and a[2][1] == ("t3", "t4", "t5") and a[0][1] == a[1][1]


def test_the_products_floor_runs_every_weight_product_the_graph_runs():
    """The floor of an fp32 graph: each layer's query/key/value product over every token (the last
    layer's query for the pooled row only), then output and MLP products, then the projection."""
    from nobackfill.bench.serve_products import products_floor

    enc = load_encoder(MODEL)
    text = enc.model.text_model
    layers, d = len(text.encoder.layers), text.config.hidden_size
    out = products_floor(enc, 1)(["a red circle", "a b"])
    tokens = max(len(i) for i in enc.tokenizer(["a red circle", "a b"])["input_ids"])
    assert [o.shape for o in out[:layers - 1]] == [(2, tokens, 3 * d)] * (layers - 1)
    assert out[layers - 1].shape == (2, tokens, 2 * d) and out[layers].shape == (2, 1, d)  # last layer: kv, pooled q
    assert out[-1].shape == (2, 1, enc.model.text_projection.weight.shape[0]) and len(out) == layers + 2
