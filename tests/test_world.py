"""Tests of the synthetic world: scenes, rendering, generation into the user data format."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from nobackfill.data.folder import DataFormatError, load_pairs
from nobackfill.data.grammars import get_grammar, languages
from nobackfill.data.render import CANVAS, render_scene
from nobackfill.data.scene import COLOURS, SHAPES, ConceptSet, Scene, SceneObject, class_names, sample_scene
from nobackfill.data.world import (
    WorldSpec, WorldStream, caption_variants, generate_world, load_world_spec, make_item, world_corpus,
)

SPLITS = ("train", "val", "test")
SMALL = dict(n_train=40, n_val=10, n_test=10)


def _digest(root: Path) -> dict[str, str]:
    """sha256 of every file of a generated world (relative path -> hex)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return generate_world(tmp_path_factory.mktemp("world"), WorldSpec(seed=3, **SMALL), workers=1,
                          progress=False)


# ----------------------------------------------------------------------------- generation
def test_generated_world_loads(world: Path) -> None:
    spec = load_world_spec(world)
    for split, n in spec.counts().items():
        ds = load_pairs(world / split)
        assert len(ds) == n and ds.skipped == 0
        assert ds.images == [f"images/{i:06d}.png" for i in range(n)]
        assert ds.num_captions == n * len(spec.langs) * spec.captions_per_image
    assert not list(world.rglob("*.tmp")), "temporary files left behind"


def test_captions_per_image_per_language(world: Path) -> None:
    spec = load_world_spec(world)
    ds = load_pairs(world / "train")
    per = Counter(zip(ds.caption_image.tolist(), ds.langs))
    assert set(per.values()) == {spec.captions_per_image}
    assert len(per) == len(ds) * len(spec.langs)
    # the captions of one image in one language are distinct paraphrases
    caps = defaultdict(set)
    for j, (i, lang) in enumerate(zip(ds.caption_image.tolist(), ds.langs)):
        caps[i, lang].add(ds.captions[j])
    assert all(len(c) == spec.captions_per_image for c in caps.values())


def test_languages_and_scripts(world: Path) -> None:
    ds = load_pairs(world / "val")
    langs = ds.languages()
    assert len(langs) >= 6 and langs[0] == "en"
    assert set(langs) == set(languages())
    scripts = {get_grammar(lang).script for lang in langs}
    assert len(scripts - {"Latin"}) >= 2, scripts
    for lang in langs:
        assert sum(1 for x in ds.langs if x == lang) == len(ds) * 2


def test_labels(world: Path) -> None:
    ds = load_pairs(world / "train")
    names = class_names()
    assert len(names) == 64
    for lab in ds.image_labels:
        for key in ("class", "class_id", "shape", "colour", "size"):
            assert key in lab
        assert 0 <= lab["class_id"] < 64
        assert names[lab["class_id"]] == lab["class"] == f"{lab['colour']} {lab['shape']}"
        assert lab["shape"] in SHAPES and lab["colour"] in COLOURS and lab["size"] in ("small", "large")
        assert 1 <= lab["n_objects"] <= 3


def test_labels_match_items(world: Path) -> None:
    """The files are the items ``make_item`` produces (pixels and labels)."""
    from PIL import Image

    ds = load_pairs(world / "test")
    for i in (0, 5):
        scene, px = make_item(3, "test", i)
        assert ds.image_labels[i] == scene.labels()
        assert np.array_equal(np.asarray(Image.open(world / "test" / ds.images[i])), px)
        en = [ds.captions[j] for j in ds.captions_of(i) if ds.langs[j] == "en"]
        assert all(c in {get_grammar("en").caption(scene, v) for v in range(4)} for c in en)


def test_world_json_round_trip(world: Path) -> None:
    spec = load_world_spec(world)
    assert spec == WorldSpec(seed=3, **SMALL)
    assert isinstance(spec.langs, tuple)
    assert load_world_spec(world / "train") == spec  # found in the parent directory
    assert load_world_spec(world / "train" / "images") is None
    data = json.loads((world / "world.json").read_text())
    assert data["n_train"] == 40 and data["version"] == spec.version


def test_load_world_spec_round_trip_with_concepts(tmp_path: Path) -> None:
    spec = WorldSpec(seed=9, n_train=1, n_val=0, n_test=0, langs=("en", "zh"), captions_per_image=1,
                     shapes=("circle", "star"), colours=("red",))
    (tmp_path / "world.json").write_text(json.dumps(dataclasses.asdict(spec)))
    back = load_world_spec(tmp_path)
    assert back == spec and back.concepts == spec.concepts


def test_generation_is_deterministic(world: Path, tmp_path: Path) -> None:
    again = generate_world(tmp_path / "again", WorldSpec(seed=3, **SMALL), workers=1, progress=False)
    assert _digest(again) == _digest(world)
    other = generate_world(tmp_path / "other", WorldSpec(seed=4, **SMALL), workers=1, progress=False)
    d_world, d_other = _digest(world), _digest(other)
    assert d_world.keys() == d_other.keys()
    for split in SPLITS:
        assert d_world[f"{split}/captions.jsonl"] != d_other[f"{split}/captions.jsonl"]
        assert d_world[f"{split}/images/000000.png"] != d_other[f"{split}/images/000000.png"]


def test_parallel_generation_matches_serial(tmp_path: Path) -> None:
    """Blocks of 500 written by two workers give the same files as one worker."""
    spec = WorldSpec(seed=1, n_train=501, n_val=0, n_test=0, langs=("en",), captions_per_image=1)
    a = generate_world(tmp_path / "a", spec, workers=1, progress=False)
    b = generate_world(tmp_path / "b", spec, workers=2, progress=False)
    assert _digest(a) == _digest(b)


def test_concept_subset(tmp_path: Path) -> None:
    spec = WorldSpec(seed=2, n_train=30, n_val=5, n_test=5, langs=("en", "ru"), captions_per_image=1,
                     shapes=("circle", "square"), colours=("red",))
    root = generate_world(tmp_path, spec, workers=1, progress=False)
    for split in SPLITS:
        ds = load_pairs(root / split)
        assert {lab["shape"] for lab in ds.image_labels} <= {"circle", "square"}
        assert {lab["colour"] for lab in ds.image_labels} == {"red"}
        assert {lab["class"] for lab in ds.image_labels} <= {"red circle", "red square"}
    for i in range(40):  # every object, not only the main one
        scene, _ = make_item(2, "train", i, spec.concepts)
        assert all(o.shape in ("circle", "square") and o.colour == "red" for o in scene.objects)


def test_concept_set_validation() -> None:
    with pytest.raises(ValueError, match="unknown concept"):
        ConceptSet(shapes=("circle", "blob"))
    with pytest.raises(ValueError, match="at least one"):
        ConceptSet(colours=())
    assert ConceptSet.parse(None, None) == ConceptSet()
    assert ConceptSet.parse(["ring"], None).colours == COLOURS


def test_make_item_split_independence() -> None:
    train0, px_train = make_item(0, "train", 0)
    test0, px_test = make_item(0, "test", 0)
    stream0, px_stream = make_item(0, "stream", 0)
    assert train0 != test0 and train0 != stream0
    assert not np.array_equal(px_train, px_test) and not np.array_equal(px_train, px_stream)
    again, px_again = make_item(0, "train", 0)  # a pure function of (seed, split, index)
    assert again == train0 and np.array_equal(px_again, px_train)
    assert make_item(1, "train", 0)[0] != train0
    assert make_item(0, "train", 1)[0] != train0


def test_caption_variants_distinct() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 4):
        v = caption_variants(rng, n, 4)
        assert len(set(v)) == n and all(0 <= x < 4 for x in v)
    assert len(caption_variants(rng, 6, 4)) == 6  # cycles when more are asked than exist


def test_world_corpus() -> None:
    spec = WorldSpec(shapes=("ring",), colours=("blue",))
    corpus = world_corpus(spec, 20)
    assert len(corpus) == 20 and all("blue" in c and "ring" in c for c in corpus)
    words = {w.strip(",") for c in corpus for w in c.split()}
    assert not words & (set(SHAPES) - {"ring"}) and not words & (set(COLOURS) - {"blue", "green"})
    assert corpus == world_corpus(spec, 20)


# ----------------------------------------------------------------------------- render
def _obj(**kw) -> SceneObject:
    base = dict(shape="circle", colour="red", size="large", texture="plain", x=0.3, y=0.5)
    base.update(kw)
    return SceneObject(**base)


def test_render_shape_and_dtype() -> None:
    scene = sample_scene(np.random.default_rng(0))
    px = render_scene(scene)
    assert px.shape == (CANVAS, CANVAS, 3) == (64, 64, 3) and px.dtype == np.uint8
    assert np.array_equal(px, render_scene(scene))  # no noise: deterministic
    noisy = render_scene(scene, np.random.default_rng(1))
    assert noisy.shape == px.shape and noisy.dtype == np.uint8 and not np.array_equal(noisy, px)


def test_render_every_shape_texture_and_background() -> None:
    from nobackfill.data.scene import BACKGROUNDS, TEXTURES

    seen = set()
    for shape in SHAPES:
        for texture in TEXTURES:
            px = render_scene(Scene("gray", (_obj(shape=shape, texture=texture, x=0.5),)))
            key = px.tobytes()
            assert key not in seen, (shape, texture)
            seen.add(key)
    bgs = {render_scene(Scene(bg, (_obj(),))).tobytes() for bg in BACKGROUNDS}
    assert len(bgs) == len(BACKGROUNDS)


def test_one_colour_change_changes_pixels() -> None:
    a = Scene("sand", (_obj(colour="red"), _obj(shape="star", colour="blue", x=0.75, y=0.3)))
    b = Scene("sand", (a.objects[0], dataclasses.replace(a.objects[1], colour="green")))
    pa, pb = render_scene(a), render_scene(b)
    assert not np.array_equal(pa, pb)
    diff = np.any(pa != pb, axis=-1)
    ys, xs = np.nonzero(diff)
    assert xs.min() >= int(0.75 * 64 - 14) and ys.max() <= int(0.3 * 64 + 14)  # only the star changed


def test_hard_negative_colour_swap() -> None:
    a = Scene("grass", (_obj(colour="red", shape="circle"), _obj(colour="blue", shape="square", x=0.75)))
    swapped = Scene("grass", (dataclasses.replace(a.objects[0], colour="blue"),
                              dataclasses.replace(a.objects[1], colour="red")))
    assert a.labels()["class"] != swapped.labels()["class"]
    assert not np.array_equal(render_scene(a), render_scene(swapped))
    for lang in languages():
        g = get_grammar(lang)
        for v in range(g.n_variants):
            assert g.caption(a, v) != g.caption(swapped, v), (lang, v)


def test_scene_relations_and_labels() -> None:
    a = Scene("gray", (_obj(x=0.2, y=0.5), _obj(x=0.8, y=0.55), _obj(x=0.25, y=0.9)))
    assert a.relation(0, 1) == "left_of" and a.relation(1, 0) == "right_of"
    assert a.relation(0, 2) == "above" and a.relation(2, 0) == "below"
    assert a.main.hpos == "left" and a.main.vpos == "middle"
    assert a.labels()["class_id"] == COLOURS.index("red") * len(SHAPES) + SHAPES.index("circle")


def test_sampled_scenes_do_not_overlap() -> None:
    from nobackfill.data.scene import SIZE_RADIUS

    for seed in range(100):
        s = sample_scene(np.random.default_rng(seed))
        assert 1 <= len(s.objects) <= 3
        for i, a in enumerate(s.objects):
            r = SIZE_RADIUS[a.size] / 64
            assert r <= a.x <= 1 - r and r <= a.y <= 1 - r
            for b in s.objects[i + 1:]:
                assert np.hypot(a.x - b.x, a.y - b.y) >= r + SIZE_RADIUS[b.size] / 64


# ----------------------------------------------------------------------------- stream
def test_world_stream_deterministic() -> None:
    s = WorldStream(batch_size=4, seed=5)
    px, caps, scenes = s.batch(3)
    assert px.shape == (4, 64, 64, 3) and px.dtype == np.uint8
    assert len(caps) == len(scenes) == 4 and all(isinstance(c, str) and c for c in caps)
    px2, caps2, scenes2 = WorldStream(batch_size=4, seed=5).batch(3)
    assert np.array_equal(px, px2) and caps == caps2 and scenes == scenes2
    px4, caps4, _ = s.batch(4)
    assert not np.array_equal(px, px4) and caps != caps4
    other_seed = WorldStream(batch_size=4, seed=6).batch(3)
    assert not np.array_equal(px, other_seed[0])
    it = iter(WorldStream(batch_size=4, seed=5, start=3))
    first = next(it)
    assert np.array_equal(first[0], px) and first[1] == caps
    assert np.array_equal(next(it)[0], px4)


def test_world_stream_concepts_and_language() -> None:
    s = WorldStream(batch_size=6, seed=0, concepts=ConceptSet(("hexagon",), ("orange",)), lang="de")
    _, caps, scenes = s.batch(0)
    assert all(sc.main.concept == "orange hexagon" for sc in scenes)
    assert all("sechseck" in c for c in caps), caps


def test_world_stream_disjoint_from_files() -> None:
    """The stream split never reproduces a train/val/test item of the same seed."""
    files = {make_item(0, split, i)[1].tobytes() for split in SPLITS for i in range(20)}
    px, _, _ = WorldStream(batch_size=20, seed=0).batch(0)
    assert not any(p.tobytes() in files for p in px)


# ----------------------------------------------------------------------------- validation e2e
def test_corrupt_and_missing_images(world: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "val"
    shutil.copytree(world / "val", root)
    ds = load_pairs(root)
    corrupt, missing = ds.images[2], ds.images[5]
    data = (root / corrupt).read_bytes()
    (root / corrupt).write_bytes(data[: len(data) // 3])  # truncated PNG
    (root / missing).unlink()
    first_line = min(ds.caption_lines[j] for j in ds.captions_of(2))
    with pytest.raises(DataFormatError) as exc:
        load_pairs(root)
    msg = str(exc.value)
    assert "captions.jsonl" in msg and f"line {first_line}" in msg and corrupt in msg
    assert exc.value.line == first_line

    # without the corrupt one, the missing one is reported
    (root / corrupt).write_bytes(data)
    missing_line = min(ds.caption_lines[j] for j in ds.captions_of(5))
    with pytest.raises(DataFormatError, match=rf"line {missing_line}: image '{missing}': image file not found"):
        load_pairs(root)

    (root / corrupt).write_bytes(data[: len(data) // 3])
    skipped = load_pairs(root, skip_bad=True)
    per_image = len(ds.captions_of(2))
    assert skipped.skipped == len(ds.captions_of(2)) + len(ds.captions_of(5)) == 2 * per_image
    assert len(skipped) == len(ds) - 2
    assert corrupt not in skipped.images and missing not in skipped.images


def test_a_folder_that_does_not_exist_has_no_world_even_under_a_world(tmp_path):
    """trial AC: ``late train --world WORLD/nope`` took WORLD's spec (a split's folder reads its
    parent's world.json), then refused a resume with "world_seed 1 (now 0)"."""
    import dataclasses
    import json

    from nobackfill.data.world import WorldSpec, load_world_spec

    (tmp_path / "world.json").write_text(json.dumps(dataclasses.asdict(WorldSpec(seed=3))))
    (tmp_path / "train").mkdir()
    assert load_world_spec(tmp_path).seed == 3 and load_world_spec(tmp_path / "train").seed == 3
    assert load_world_spec(tmp_path / "nope") is None
