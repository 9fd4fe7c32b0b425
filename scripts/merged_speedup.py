"""Query encoding with an upgrade's adapters merged into the weights (what the Searcher serves)
against the switchable, unmerged upgrade: equal outputs, and the time of one text query (1 thread).

    python scripts/merged_speedup.py

Measured 2026-11-24 (2 cores, one thread): world XBT upgrade, text query 3.36 -> 2.42 ms (1.39x),
max abs difference 2.4e-7; MiniLM text upgrade 31.2 -> 25.0 ms (1.25x), max abs difference 6.5e-7.
"""
import time, numpy as np, torch
torch.set_num_threads(1)
from nobackfill.encoders import load_encoder
from nobackfill.compat.upgrade import load_upgrade
from nobackfill.evaluate import load_eval_data
from nobackfill.encoders.minilm import MiniLMTextEncoder
ds = load_eval_data("data/world", "val", langs=["en"], limit=200)
u = load_upgrade("upgrades/world-old-to-new").apply(load_encoder("models/world-new"))
m = u.merged()
for name, f in (("texts", lambda e: e.encode_texts(ds.captions)), ("images", lambda e: e.encode_images(ds.image_paths()))):
    a, b = f(u), f(m)
    print(name, "max abs diff", float(np.abs(a - b).max()))
q = ds.captions[:1]
for enc, label in ((u, "unmerged"), (m, "merged")):
    enc.encode_texts(q)
    t = time.perf_counter()
    for _ in range(200): enc.encode_texts(q)
    print(label, "world text query ms", (time.perf_counter() - t) / 200 * 1000)
ut = load_upgrade("upgrades/m30k-old-text-to-minilm").apply(MiniLMTextEncoder.pretrained()); mt = ut.merged()
print("text upgrade max abs diff", float(np.abs(ut.encode_texts(ds.captions) - mt.encode_texts(ds.captions)).max()))
for enc, label in ((ut, "unmerged"), (mt, "merged")):
    enc.encode_texts(q)
    t = time.perf_counter()
    for _ in range(100): enc.encode_texts(q)
    print(label, "MiniLM text query ms", (time.perf_counter() - t) / 100 * 1000)
with u.switched(False): pass
try:
    with m.switched(False): pass
except ValueError as e: print("refused:", e)
