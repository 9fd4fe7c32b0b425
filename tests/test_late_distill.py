"""Target-CMLI distillation (the Target-CMLI paper, Eq. 5-8) and CMLI training: hand-computed routing / empty
target cases, and every training kind for a few steps through the one loop."""

from __future__ import annotations

import json
import math

import pytest
import torch

from nobackfill.late.distill import KDConfig, empty_target_loss, route_tokens
from nobackfill.late.train import CMLIConfig, cmli_info_nce

from _late_helpers import tiny_model, tiny_tokenizer


def test_route_tokens_hand_computed_with_empty_target() -> None:
    # student tokens: w1 = (1, 0), w2 = (0, 1), w3 masked; teacher patches p1 = (1, 0), p2 = (0.6, 0.8)
    s = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])
    t = torch.tensor([[[1.0, 0.0], [0.6, 0.8]]])
    mask = torch.tensor([[True, True, False]])
    empty = torch.nn.Parameter(torch.tensor([0.6, 1.6]))  # normalised inside: (0.351, 0.936)
    index, gate = route_tokens(s, mask, t, None, empty, gate_temperature=0.1)
    # w1: patches 1.0 / 0.6 vs empty 0.351 -> p1, kept; w2: patches 0.0 / 0.8 vs empty 0.936 -> excused
    assert index[0, :2].tolist() == [0, 1]
    assert gate.tolist() == [[1.0, 0.0, 0.0]]
    l_reg, p = empty_target_loss(gate, mask.float())
    assert p.item() == pytest.approx(0.5)
    assert l_reg.item() == pytest.approx(math.log(2.0))  # Eq. 8: -log(1/2)
    l_reg.backward()
    # L_Reg falls when fewer tokens pick the empty target: a gradient step moves the empty target
    # away from w2 (its cosine to w2 decreases)
    before = torch.nn.functional.normalize(empty.detach(), dim=0) @ s[0, 1]
    after = torch.nn.functional.normalize(empty.detach() - 0.5 * empty.grad, dim=0) @ s[0, 1]
    assert after < before - 1e-4


def test_route_without_empty_target_keeps_every_valid_token() -> None:
    s = torch.randn(2, 4, 3)
    t = torch.randn(2, 5, 3)
    mask = torch.tensor([[True, True, False, True], [True, False, False, False]])
    index, gate = route_tokens(s, mask, t, None, None, 0.05)
    assert gate.tolist() == mask.float().tolist()
    ref = torch.einsum("bmd,bnd->bmn", torch.nn.functional.normalize(s, dim=-1),
                       torch.nn.functional.normalize(t, dim=-1)).argmax(-1)
    # project_tokens(None) leaves the tokens as they are; argmax of the raw dot products (Eq. 2)
    raw = torch.einsum("bmd,bnd->bmn", s, t).argmax(-1)
    assert torch.equal(index, raw) and ref.shape == raw.shape


def test_cmli_info_nce_hand_computed() -> None:
    i2t = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    t2i = torch.tensor([[1.0, 0.5], [0.0, 1.0]])
    loss = cmli_info_nce(i2t, t2i, 1.0)
    ce_i = math.log1p(math.exp(-1.0))  # rows of i2t: [1, 0] and [0, 1]
    ce_t = 0.5 * (math.log(1 + math.exp(-1.0)) + math.log(1 + math.exp(-0.5)))  # rows of t2i^T: [1, 0], [0.5, 1]
    assert loss.item() == pytest.approx(0.5 * (ce_i + ce_t), rel=1e-6)


def test_configs_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="mode"):
        KDConfig(mode="patch")
    with pytest.raises(ValueError, match="not both 0"):
        CMLIConfig(global_weight=0, cmli_weight=0)
    assert KDConfig(empty_target=False).label == "target_cmli" and KDConfig(mode="global").label == "global_kd"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("late_kd")
    tok = tiny_tokenizer()
    tiny_model(root, "student", 16, tok)
    teacher = tiny_model(root, "teacher", 24, tok, seed=1)
    return root, tok, teacher


@pytest.mark.parametrize("kind,kd", [("global", None), ("cmli", None), ("kd", KDConfig(mode="global")),
                                     ("kd", KDConfig(empty_target=False)), ("kd", KDConfig())])
def test_every_kind_trains_through_the_one_loop(tiny, kind, kd) -> None:
    from nobackfill.data.world import WorldSpec
    from nobackfill.encoders import load_encoder
    from nobackfill.late.world import train_world_method

    root, tok, teacher = tiny
    out = root / f"{kind}-{kd.label if kd else 'x'}"
    method, result = train_world_method(kind, out, WorldSpec(), tok, preset=str(root / "student.toml"), steps=3,
                                        batch_size=6, teacher=teacher, kd=kd)
    assert result.steps == 3 and math.isfinite(result.last_loss)
    logs = result.history[-1]
    if kind == "cmli":
        assert {"loss_global", "loss_cmli", "cmli_temperature"} <= set(logs)
    if kd is not None and kd.mode == "target-cmli":
        assert {"loss_patch", "loss_token"} <= set(logs)
        assert ("empty_share" in logs) == kd.empty_target
    enc = load_encoder(out)
    assert enc.embed_dim == 16
    assert json.loads((out / "recipe.json").read_text())["kind"] == kind
    if kd is not None and kd.empty_target and kd.mode == "target-cmli":
        from nobackfill.data.world import WorldStream

        px, caps, _ = WorldStream(4, seed=3).batch(0)
        routing = method.empty_routing(px, caps)
        assert 0.0 <= routing["share"] <= 1.0 and routing["n_tokens"] > 0


def test_late_train_cli_with_swap_twins(tiny) -> None:
    from _late_helpers import invoke, tiny_world

    root, tok, teacher = tiny
    world = tiny_world(root, n_val=2, n_test=2)
    teacher.save(root / "teacher-model")
    out = root / "cli-cmli"
    r = invoke("late", "train", "--kind", "cmli", "--world", world, "--out", out, "--preset", root / "student.toml",
               "--teacher", root / "teacher-model", "--steps", 2, "--batch-size", 6, "--swap-twins")
    assert r.exit_code == 0, r.output
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["swap_twins"] is True and recipe["kind"] == "cmli" and recipe["steps"] == 2


def test_late_train_cli_passes_the_whole_loop_config(tiny) -> None:
    """``--set loop.*`` reaches the loop (weights change) and the recipe records it (trial F #3)."""
    from safetensors.torch import load_file

    from _late_helpers import invoke, tiny_world

    root, tok, teacher = tiny
    world = tiny_world(root, n_val=2, n_test=2)
    teacher.save(root / "teacher-model")
    common = ("late", "train", "--kind", "global", "--world", world, "--preset", root / "student.toml",
              "--teacher", root / "teacher-model", "--steps", 3, "--batch-size", 6)
    runs = {"plain": (), "wd": ("--set", "loop.weight_decay=0.9", "--set", "loop.grad_clip=0.001",
                                "--set", "loop.schedule=constant", "--set", "loop.checkpoint_every=2")}
    for name, extra in runs.items():
        r = invoke(*common, "--out", root / f"loop-{name}", *extra)
        assert r.exit_code == 0, r.output
    plain, wd = (json.loads((root / f"loop-{n}" / "recipe.json").read_text())["loop"] for n in runs)
    assert (plain["weight_decay"], plain["grad_clip"], plain["schedule"]) == (0.05, 1.0, "cosine")
    assert plain["checkpoint_every"] == 100 and plain["log_every"] == 3  # the late defaults, as before
    assert (wd["weight_decay"], wd["grad_clip"], wd["schedule"], wd["checkpoint_every"]) == (0.9, 0.001,
                                                                                            "constant", 2)
    a, b = (load_file(str(root / f"loop-{n}" / "model.safetensors")) for n in runs)
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_kd_needs_matching_patch_grid(tiny) -> None:
    from nobackfill.encoders import create_model, get_preset
    from nobackfill.late.distill import TargetCMLIDistillation

    root, tok, teacher = tiny
    p = root / "coarse.toml"
    p.write_text((root / "student.toml").read_text().replace("patch_size = 16", "patch_size = 32"))
    with pytest.raises(ValueError, match="patch grid"):
        TargetCMLIDistillation(create_model(get_preset(p), tok), teacher)


def test_kd_refuses_a_teacher_without_an_image_tower(tiny) -> None:
    """trial AL: a text-only teacher (a MiniLM) failed with AttributeError ('vision_config')."""
    from pathlib import Path

    from nobackfill.encoders import create_model, get_preset, load_encoder
    from nobackfill.late.distill import TargetCMLIDistillation

    root, tok, _ = tiny
    text_only = load_encoder(Path(__file__).resolve().parents[1] / "models" / "m30k-old-text")
    with pytest.raises(ValueError, match="has no image tower"):
        TargetCMLIDistillation(create_model(get_preset(root / "student.toml"), tok), text_only)
