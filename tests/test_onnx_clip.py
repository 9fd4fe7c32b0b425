"""The CLIP text tower written as an ONNX Runtime graph (encoders/onnx_clip.py): the same vectors as
torch on padded batches, both end-of-text rules and both activations; chosen by the export for a
CLIP text tower only, and replaced by the traced export when it does not match torch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
import torch  # noqa: E402
from transformers import AutoTokenizer, CLIPConfig, CLIPModel  # noqa: E402

from nobackfill.encoders import load_encoder  # noqa: E402
from nobackfill.encoders.clip import CLIPDualEncoder  # noqa: E402
from nobackfill.encoders.onnx import _export, _session, _text_batch, _tower, export_onnx, onnx_export_info  # noqa: E402
from nobackfill.encoders.onnx_clip import clip_text_graph  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["a", "a red circle", "two blue squares at the top left next to a yellow cross and a green one", "purple x"]


def _tiny_clip(eos_token_id: int | None, act: str, seed: int) -> CLIPDualEncoder:
    tok = AutoTokenizer.from_pretrained(ROOT / "models" / "world-old", local_files_only=True)
    torch.manual_seed(seed)
    text = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
            "max_position_embeddings": 64, "vocab_size": len(tok), "hidden_act": act,
            "eos_token_id": tok.eos_token_id if eos_token_id is None else eos_token_id,
            "bos_token_id": tok.bos_token_id, "pad_token_id": tok.pad_token_id}
    cfg = CLIPConfig(text_config=text, vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                                      "num_attention_heads": 2, "image_size": 32, "patch_size": 16},
                     projection_dim=24)
    return CLIPDualEncoder(CLIPModel(cfg).eval(), tok, meta={"name": "tiny"})


@pytest.mark.parametrize("eos_token_id,act", [(None, "quick_gelu"), (2, "quick_gelu"), (None, "gelu")])
def test_the_graph_gives_torchs_vectors_on_padded_batches(tmp_path, eos_token_id, act):
    enc = _tiny_clip(eos_token_id, act, seed=len(act) + (eos_token_id or 0))
    proto = clip_text_graph(enc)
    assert proto is not None
    onnx.checker.check_model(proto)
    path = tmp_path / "text.onnx"
    onnx.save(proto, str(path))
    session, module = _session(path), _tower(enc, "text")
    for batch in (TEXTS[:1], TEXTS[2:3], TEXTS, TEXTS[::-1] * 3):  # batch 1 short and long, padded batches
        feed = _text_batch(enc, batch)
        with torch.inference_mode():
            ref = module(*[torch.from_numpy(v) for v in feed.values()]).numpy()
        got = session.run(None, feed)[0]
        assert got.shape == ref.shape and np.abs(got - ref).max() <= 1e-5
    # fewer than half the traced graph's nodes (fused attention; no shape arithmetic)
    traced = tmp_path / "traced.onnx"
    _export(module, tuple(_text_batch(enc, TEXTS).values()), ["input_ids", "attention_mask"],
            {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}, traced)
    assert 2 * len(proto.graph.node) < len(onnx.load(str(traced)).graph.node)


def test_only_a_plain_clip_text_tower_is_written_as_the_graph():
    assert clip_text_graph(load_encoder(ROOT / "models" / "m30k-old-text")) is None  # MiniLM (BERT)
    enc = _tiny_clip(None, "relu", seed=0)
    assert clip_text_graph(enc) is None  # an activation the graph does not write


def test_the_export_records_the_graph_of_each_tower(tmp_path):
    d = tmp_path / "world-old"
    shutil.copytree(ROOT / "models" / "world-old", d)
    info = export_onnx(d, int8=True)
    assert info["towers"]["text"]["graph"] == "clip-text" and info["towers"]["image"]["graph"] == "traced"
    assert info["towers"]["text"]["max_abs_diff"] <= 1e-4 and info["towers"]["text"]["int8"]["max_abs_diff"] < 0.05
    assert json.loads((d / "onnx" / "export.json").read_text())["towers"]["text"]["graph"] == "clip-text"
    traced = export_onnx(d, towers=["text"], graph="traced")
    assert traced["towers"]["text"]["graph"] == "traced" and onnx_export_info(d)["towers"]["text"]["graph"] == "traced"
    m = tmp_path / "m30k"
    shutil.copytree(ROOT / "models" / "m30k-old-text", m)
    assert export_onnx(m)["towers"]["text"]["graph"] == "traced"
    with pytest.raises(ValueError, match="graph: one of auto, traced"):
        export_onnx(d, graph="fast")


def test_a_graph_that_differs_from_torch_is_replaced_by_the_traced_export(tmp_path, monkeypatch, caplog):
    from nobackfill.encoders import onnx_clip

    real = onnx_clip.clip_text_graph

    def off_by_a_little(encoder):
        proto = real(encoder)
        for init in proto.graph.initializer:
            if init.name == "projection":
                w = onnx.numpy_helper.to_array(init).copy()
                w[0] += 0.05  # one input feature's weights off (a uniform scale would vanish in the L2 norm)
                init.CopyFrom(onnx.numpy_helper.from_array(w, "projection"))
        return proto

    monkeypatch.setattr(onnx_clip, "clip_text_graph", off_by_a_little)
    d = tmp_path / "world-old"
    shutil.copytree(ROOT / "models" / "world-old", d)
    with caplog.at_level("WARNING", logger="nobackfill.encoders.onnx"):
        info = export_onnx(d, towers=["text"])
    assert info["towers"]["text"]["graph"] == "traced" and info["towers"]["text"]["max_abs_diff"] <= 1e-4
    assert "exporting by tracing instead" in caplog.text


def test_the_cli_names_the_graph_it_wrote_and_takes_traced(tmp_path):
    from typer.testing import CliRunner

    from nobackfill.cli import app

    d = tmp_path / "m"
    shutil.copytree(ROOT / "models" / "world-old", d)
    r = CliRunner().invoke(app, ["export-onnx", str(d), "--towers", "text"])
    assert r.exit_code == 0 and "(clip-text graph, max abs diff vs torch" in r.stdout, r.output
    r = CliRunner().invoke(app, ["export-onnx", str(d), "--towers", "text", "--graph", "traced"])
    assert r.exit_code == 0 and "(traced graph," in r.stdout, r.output
    r = CliRunner().invoke(app, ["export-onnx", str(d), "--graph", "fast"])
    assert r.exit_code == 2 and "graph: one of auto, traced, not 'fast'" in r.output
    assert onnx_export_info(d)["towers"]["text"]["graph"] == "traced"  # the refused call changed nothing
