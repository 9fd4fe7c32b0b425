"""Images are read as a person sees them (nobackfill.data.images): every Pillow mode, EXIF
orientation, transparency, animations, odd sizes and names; and the library's readers (encoder
preprocessing, data folders, RECO thumbnails) use it."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nobackfill.data.images import ImageReadError, open_rgb, to_rgb

ROOT = Path(__file__).resolve().parents[1]
WHITE = (255, 255, 255)


def _photo16(kind: int, h: int = 48, w: int = 64) -> np.ndarray:
    """Three different 16-bit 'photos' using the full 16-bit range."""
    rng = np.random.default_rng(kind)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    if kind == 0:
        v = x / (w - 1)  # horizontal ramp
    elif kind == 1:
        v = ((x // 8 + y // 8) % 2) * 0.9 + 0.05  # checkerboard
    else:
        v = 1.0 - y / (h - 1)  # vertical ramp, bright on top
    v = v * 65535 + rng.integers(-200, 200, (h, w))
    return np.clip(v, 0, 65535).astype(np.uint16)


def _save(im: Image.Image, path: Path, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    im.save(path, **kw)
    return path


def _quadrants(h: int = 20, w: int = 40) -> np.ndarray:
    """An asymmetric RGB picture (four coloured quadrants) to see rotations and flips."""
    a = np.zeros((h, w, 3), np.uint8)
    a[: h // 2, : w // 2] = (255, 0, 0)
    a[: h // 2, w // 2:] = (0, 255, 0)
    a[h // 2:, : w // 2] = (0, 0, 255)
    a[h // 2:, w // 2:] = (250, 250, 0)
    return a


def _exif(orientation: int) -> Image.Exif:
    ex = Image.Exif()
    ex[0x0112] = orientation
    return ex


# ----------------------------------------------------------------------------- high bit depth
def test_16bit_png_is_scaled_not_clipped_to_white(tmp_path):
    outs = []
    for k in range(3):
        arr = _photo16(k)
        p = _save(Image.fromarray(arr), tmp_path / f"p{k}.png")
        with Image.open(p) as im:
            assert im.mode == "I;16"
        out = np.asarray(open_rgb(p))
        assert out.shape == (48, 64, 3) and out.dtype == np.uint8
        np.testing.assert_array_equal(out[..., 0], np.round(arr / 257.0).astype(np.uint8))
        assert (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()
        assert not (out == 255).all() and out.std() > 20
        outs.append(out)
    assert not np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[1], outs[2])


def test_16bit_big_endian_and_32bit_int_and_float(tmp_path):
    arr = _photo16(0)
    big = Image.fromarray(arr.astype(">u2"))
    assert big.mode == "I;16B"
    np.testing.assert_array_equal(np.asarray(to_rgb(big))[..., 0], np.round(arr / 257.0).astype(np.uint8))
    # 16-bit data decoded as I (32-bit int) reads like I;16
    as_i = Image.open(_save(Image.fromarray(arr.astype(np.int32)), tmp_path / "i.tif"))
    assert as_i.mode == "I"
    np.testing.assert_array_equal(np.asarray(to_rgb(as_i))[..., 0], np.round(arr / 257.0).astype(np.uint8))
    # 8-bit values in I stay as they are; values beyond 16 bits are scaled by their actual range
    small = np.arange(256, dtype=np.int32).reshape(16, 16)
    np.testing.assert_array_equal(np.asarray(to_rgb(Image.fromarray(small)))[..., 0], small.astype(np.uint8))
    wide = Image.fromarray((small * 1000 - 50000).astype(np.int32))
    g = np.asarray(to_rgb(wide))[..., 0]
    assert g.min() == 0 and g.max() == 255 and (np.diff(g.ravel().astype(int)) >= 0).all()
    # float: [0, 1] -> [0, 255]; [0, 255] as is; NaN -> 0
    f = (small / 255.0).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(to_rgb(Image.fromarray(f)))[..., 0], small.astype(np.uint8))
    f_tif = Image.open(_save(Image.fromarray(f), tmp_path / "f.tif"))
    assert f_tif.mode == "F"
    np.testing.assert_array_equal(np.asarray(to_rgb(f_tif))[..., 0], small.astype(np.uint8))
    np.testing.assert_array_equal(np.asarray(to_rgb(Image.fromarray(small.astype(np.float32))))[..., 0],
                                  small.astype(np.uint8))
    nan = f.copy()
    nan[0, 0] = np.nan
    assert np.asarray(to_rgb(Image.fromarray(nan)))[0, 0, 0] == 0


@pytest.fixture(scope="module")
def enc():
    from nobackfill.encoders import load_encoder

    return load_encoder(ROOT / "models" / "world-old")


def test_16bit_images_get_distinct_vectors_from_the_encoder(tmp_path, enc):
    paths = [_save(Image.fromarray(_photo16(k)), tmp_path / f"p{k}.png") for k in range(3)]
    white = _save(Image.new("RGB", (64, 48), WHITE), tmp_path / "white.png")
    v = enc.encode_images(paths + [white])
    sims = v @ v.T
    for i in range(3):
        assert sims[i, 3] < 0.999, "a 16-bit photo was embedded as a blank white image"
        for j in range(i + 1, 3):
            assert sims[i, j] < 0.999, (i, j, sims)
    # the same pixels as an 8-bit file give the same vector
    eight = _save(Image.fromarray(np.round(_photo16(0) / 257.0).astype(np.uint8)), tmp_path / "p0-8bit.png")
    np.testing.assert_allclose(enc.encode_images([eight])[0], v[0], atol=1e-5)


# ----------------------------------------------------------------------------- transparency
def test_rgba_transparent_areas_become_white(tmp_path):
    a = np.zeros((8, 8, 4), np.uint8)
    a[..., :3] = (200, 10, 10)
    a[:4, ..., 3] = 0  # top half fully transparent
    a[4:, :4, 3] = 255  # bottom-left opaque
    a[4:, 4:, 3] = 128  # bottom-right half transparent
    out = np.asarray(open_rgb(_save(Image.fromarray(a, "RGBA"), tmp_path / "a.png")))
    assert (out[:4] == WHITE).all()
    assert (out[4:, :4] == (200, 10, 10)).all()
    half = out[4:, 4:].reshape(-1, 3)
    assert (np.abs(half.astype(int) - (228, 132, 132)) <= 2).all()


def test_palette_with_transparency_png_and_gif(tmp_path):
    p = Image.new("P", (6, 6), 0)
    p.putpalette([0, 0, 0, 0, 128, 255] + [0] * 762)  # index 0 black, index 1 blue
    p.paste(1, (0, 0, 3, 6))
    for name in ("p.png", "p.gif"):
        path = _save(p, tmp_path / name, transparency=0)
        with Image.open(path) as im:
            assert im.mode == "P" and "transparency" in im.info
        out = np.asarray(open_rgb(path))
        assert (out[:, :3] == (0, 128, 255)).all() and (out[:, 3:] == WHITE).all()


def test_la_and_pa_on_white(tmp_path):
    la = np.zeros((4, 4, 2), np.uint8)
    la[..., 0] = 60
    la[:, :2, 1] = 255
    out = np.asarray(open_rgb(_save(Image.fromarray(la, "LA"), tmp_path / "la.png")))
    assert (out[:, :2] == 60).all() and (out[:, 2:] == 255).all()
    pa = Image.fromarray(np.dstack([np.full((4, 4, 3), 30, np.uint8), la[..., 1:]]), "RGBA").convert("PA")
    assert pa.mode == "PA"
    out = np.asarray(to_rgb(pa))
    assert (out[:, 2:] == 255).all() and (np.abs(out[:, :2].astype(int) - 30) <= 3).all()


def test_grey_colour_key_transparency(tmp_path):
    g = np.full((4, 4), 90, np.uint8)
    g[0, 0] = 7
    out = np.asarray(open_rgb(_save(Image.fromarray(g), tmp_path / "g.png", transparency=7)))
    assert (out[0, 0] == WHITE).all() and (out[1:, 1:] == 90).all()
    g16 = np.full((4, 4), 30000, np.uint16)
    g16[0, 0] = 5
    path = _save(Image.fromarray(g16), tmp_path / "g16.png", transparency=5)
    out = np.asarray(open_rgb(path))
    assert (out[0, 0] == WHITE).all() and (out[1:, 1:] == round(30000 / 257)).all()


# ----------------------------------------------------------------------------- other modes / formats
def test_cmyk_jpeg_and_progressive_jpeg(tmp_path):
    rgb = np.zeros((16, 16, 3), np.uint8)
    rgb[:, :8] = (220, 30, 30)
    rgb[:, 8:] = (30, 30, 220)
    cmyk = _save(Image.fromarray(rgb).convert("CMYK"), tmp_path / "c.jpg", quality=95)
    with Image.open(cmyk) as im:
        assert im.mode == "CMYK"
    out = np.asarray(open_rgb(cmyk)).astype(int)
    assert np.abs(out - rgb).mean() < 12
    prog = _save(Image.fromarray(rgb), tmp_path / "prog.jpg", quality=95, progressive=True)
    with Image.open(prog) as im:
        assert im.info.get("progressive") or im.info.get("progression")
    assert np.abs(np.asarray(open_rgb(prog)).astype(int) - rgb).mean() < 6


@pytest.mark.parametrize("orientation, k", [(6, -1), (8, 1), (3, 2)])
def test_exif_orientation_is_applied(tmp_path, orientation, k):
    a = _quadrants()
    png = _save(Image.fromarray(a), tmp_path / "o.png", exif=_exif(orientation))
    np.testing.assert_array_equal(np.asarray(open_rgb(png)), np.rot90(a, k))
    jpg = _save(Image.fromarray(a), tmp_path / "o.jpg", exif=_exif(orientation), quality=95)
    with Image.open(jpg) as im:  # the decoded, unrotated pixels, turned by hand
        raw = np.asarray(im.convert("RGB"))
    out = np.asarray(open_rgb(jpg))
    np.testing.assert_array_equal(out, np.rot90(raw, k))
    assert np.abs(out.astype(int) - np.rot90(a, k)).mean() < 10
    # an already opened image (as a caller passes it) is turned too
    with Image.open(jpg) as im:
        np.testing.assert_array_equal(np.asarray(to_rgb(im)), out)


def test_exif_orientation_in_preprocessing_and_thumbnails(tmp_path):
    from nobackfill.encoders.preprocess import ImagePreprocessor
    from nobackfill.reco.memory import image_content_hash, thumbnail_features

    a = _quadrants(32, 48)
    upright = _save(Image.fromarray(np.rot90(a, -1)), tmp_path / "upright.png")
    sideways = _save(Image.fromarray(a), tmp_path / "sideways.png", exif=_exif(6))
    pre = ImagePreprocessor(size=16, crop=16)
    np.testing.assert_array_equal(pre.to_array(sideways), pre.to_array(upright))
    np.testing.assert_array_equal(thumbnail_features([sideways]), thumbnail_features([upright]))
    assert image_content_hash(sideways) == image_content_hash(upright)


def test_16bit_and_transparent_thumbnails(tmp_path):
    from nobackfill.reco.memory import thumbnail_features

    paths = [_save(Image.fromarray(_photo16(k)), tmp_path / f"p{k}.png") for k in range(3)]
    f = thumbnail_features(paths)
    assert np.isfinite(f).all() and (np.abs(f).sum(axis=1) > 1).all()  # not a blank (all-equal) thumbnail
    assert (f @ f.T)[np.triu_indices(3, 1)].max() < 0.99


def test_one_bit_grey_webp_bmp_tiff(tmp_path):
    bits = (np.indices((8, 8)).sum(axis=0) % 2).astype(bool)
    out = np.asarray(open_rgb(_save(Image.fromarray(bits).convert("1"), tmp_path / "b.png")))
    np.testing.assert_array_equal(out[..., 0], np.where(bits, 255, 0))
    grey = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4
    out = np.asarray(open_rgb(_save(Image.fromarray(grey), tmp_path / "g.png")))
    assert (out == grey[..., None]).all()
    a = _quadrants()
    formats = (("x.webp", {"lossless": True}), ("x.bmp", {}), ("x.tif", {}), ("x.tiff", {"compression": "tiff_lzw"}))
    for name, kw in formats:
        np.testing.assert_array_equal(np.asarray(open_rgb(_save(Image.fromarray(a), tmp_path / name, **kw))), a,
                                      err_msg=name)


def test_animated_gif_first_frame(tmp_path):
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    path = _save(frames[0], tmp_path / "anim.gif", save_all=True, append_images=frames[1:], duration=50)
    with Image.open(path) as im:
        assert im.is_animated and im.n_frames == 3
        im.seek(2)
        assert (np.asarray(to_rgb(im)) == (255, 0, 0)).all()
    assert (np.asarray(open_rgb(path)) == (255, 0, 0)).all()


def test_tiny_and_large_images(tmp_path):
    from nobackfill.encoders.preprocess import ImagePreprocessor

    pre = ImagePreprocessor(size=32, crop=32)
    one = _save(Image.new("I;16", (1, 1), 40000), tmp_path / "one.png")
    arr = pre.to_array(one)
    assert arr.shape == (32, 32, 3) and (arr == round(40000 / 257)).all()
    big = np.zeros((3000, 4000), np.uint16)
    big[:, 2000:] = 65535
    path = _save(Image.fromarray(big), tmp_path / "big.png", compress_level=1)
    out = open_rgb(path)
    assert out.size == (4000, 3000) and out.mode == "RGB"
    arr = pre.to_array(path)
    assert arr.shape == (32, 32, 3) and arr[:, :10].max() == 0 and arr[:, -10:].min() == 255


def test_arrays_and_pil_images_of_any_mode_in_preprocessing():
    from nobackfill.encoders.preprocess import ImagePreprocessor

    pre = ImagePreprocessor(size=8, crop=8)
    arr16 = np.full((8, 8), 51400, np.uint16)  # 200 in 8 bits
    assert (pre.to_array(arr16) == 200).all()
    assert (pre.to_array(Image.fromarray(arr16)) == 200).all()
    rgba = np.zeros((8, 8, 4), np.uint8)
    assert (pre.to_array(rgba) == 255).all()  # fully transparent: the white background


def test_odd_names_in_nested_folders(tmp_path, enc):
    from nobackfill.collection.ingest import folder_items

    names = ["a b/c d/photo one.png", "ñandú/über/café.png", "emoji 🙂/🎉 party.png"]
    for k, rel in enumerate(names):
        _save(Image.fromarray(_photo16(k)), tmp_path / "data" / rel)
        np.testing.assert_array_equal(np.asarray(open_rgb(tmp_path / "data" / rel))[..., 0],
                                      np.round(_photo16(k) / 257.0).astype(np.uint8))
    fi = folder_items(tmp_path / "data")
    assert sorted(Path(it.source["path"]).relative_to(tmp_path / "data").as_posix() for it in fi.items) \
        == sorted(names)
    assert fi.uncaptioned == 3 and fi.skipped == 0
    v = enc.encode_images([it.payload for it in fi.items])
    assert (v @ v.T)[np.triu_indices(3, 1)].max() < 0.999  # three pictures, three vectors


# ----------------------------------------------------------------------------- errors
def test_open_rgb_errors_name_the_file(tmp_path):
    with pytest.raises(ImageReadError, match="missing.png") as e:
        open_rgb(tmp_path / "missing.png")
    assert isinstance(e.value, ValueError) and e.value.path == tmp_path / "missing.png"
    bad = tmp_path / "not an image.png"
    bad.write_bytes(b"hello")
    with pytest.raises(ValueError, match="not an image.png"):
        open_rgb(bad)
    with pytest.raises(ImageReadError, match="<bytes>"):
        open_rgb(b"\x89PNG broken")
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    raw = _save(Image.fromarray(noise), tmp_path / "cut.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(raw[: len(raw) // 2])  # the header opens, the pixels stop half-way
    with pytest.raises(ImageReadError, match="cut.png"):
        open_rgb(tmp_path / "cut.png")


def test_open_rgb_bytes_is_loaded_and_independent(tmp_path):
    buf = io.BytesIO()
    Image.fromarray(_photo16(1)).save(buf, format="PNG")
    im = open_rgb(buf.getvalue())
    assert im.mode == "RGB" and im.size == (64, 48)
    path = _save(Image.fromarray(_quadrants()), tmp_path / "q.png")
    im = open_rgb(path)
    path.unlink()  # nothing left open or lazy
    assert np.asarray(im).shape == (20, 40, 3)
