"""schemathesis hooks for tests/test_api_schema.py (``SCHEMATHESIS_HOOKS=tests/_schemathesis_hooks.py``):
the image parts of the API's multipart bodies are declared with image media types
(``encoding.contentType``), so positive cases must be images of those types. schemathesis has no
image generator of its own (``format: binary`` alone is any bytes), so these register one per type:
small files in many Pillow modes (alpha, palette with transparency, 16-bit, float, 1-bit, CMYK,
EXIF-rotated, animated), the cases :func:`nobackfill.data.images.to_rgb` exists for."""

from __future__ import annotations

import io

import numpy as np
import schemathesis
from hypothesis import strategies as st
from PIL import Image


def _save(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _samples() -> dict[str, list[bytes]]:
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (12, 9, 3), dtype=np.uint8))
    rgba = Image.fromarray(rng.integers(0, 255, (7, 10, 4), dtype=np.uint8), "RGBA")
    grey16 = Image.fromarray(rng.integers(0, 65535, (6, 6), dtype=np.uint16))
    pal = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    pal.info["transparency"] = 0
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees
    frames = [Image.new("P", (5, 5), i) for i in (1, 2)]
    anim = io.BytesIO()
    frames[0].save(anim, "GIF", save_all=True, append_images=frames[1:])
    return {
        "image/png": [_save(rgb, "PNG"), _save(rgba, "PNG"), _save(grey16, "PNG"), _save(pal, "PNG"),
                      _save(rgb.convert("LA"), "PNG"), _save(rgb.convert("1"), "PNG")],
        "image/jpeg": [_save(rgb, "JPEG"), _save(rgb.convert("CMYK"), "JPEG"), _save(rgb, "JPEG", exif=exif),
                       _save(rgb.convert("L"), "JPEG")],
        "image/gif": [anim.getvalue(), _save(pal, "GIF")],
        "image/webp": [_save(rgba, "WEBP"), _save(rgb, "WEBP", lossless=True)],
        "image/tiff": [_save(Image.fromarray(rng.random((5, 4), dtype=np.float32)), "TIFF"), _save(rgb, "TIFF")],
        "image/bmp": [_save(rgb, "BMP"), _save(rgb.convert("1"), "BMP")],
    }


for _media_type, _files in _samples().items():
    schemathesis.openapi.media_type(_media_type, st.sampled_from(_files))
