"""Reading images as a person sees them: the one place the library turns a file into RGB pixels.

:func:`to_rgb` applies the EXIF orientation, takes the first frame of an animation and converts
every Pillow mode to 8-bit RGB:

* ``I;16`` / ``I;16B`` / ``I;16L`` (16-bit): ``v / 257``;
* ``I`` (32-bit int): as is when the values lie in [0, 255], ``v / 257`` when they lie in
  [0, 65535] (16-bit data decoded as ``I``), otherwise scaled from their actual [min, max];
* ``F`` (float): ``v * 255`` when the values lie in [0, 1], as is in [0, 255], otherwise scaled
  from their actual [min, max] (NaN / inf count as 0);
* alpha (``RGBA``, ``LA``, ``PA``, premultiplied ``RGBa`` / ``La``) and palette or colour-key
  transparency: composited on white;
* ``CMYK``, ``YCbCr``, ``LAB``, ``HSV``, ``1``, ``L``, ``P``: converted to RGB.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

__all__ = ["BACKGROUND", "ImageReadError", "open_rgb", "to_rgb"]

#: the colour transparent pixels are composited on
BACKGROUND = (255, 255, 255)
_ORIENTATION = 0x0112


class ImageReadError(ValueError):
    """An image file that cannot be read; ``path`` names it (None for raw bytes)."""

    def __init__(self, message: str, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        super().__init__(message)


def _first_frame(im: Image.Image) -> Image.Image:
    if getattr(im, "is_animated", False) and im.tell() != 0:
        im.seek(0)
    return im


def _orient(im: Image.Image) -> Image.Image:
    """``im`` turned upright by its EXIF orientation (``im`` itself when upright or unreadable)."""
    im.load()  # decode errors propagate (a PNG reads its EXIF after the pixels)
    try:
        orientation = im.getexif().get(_ORIENTATION, 1)
    except Exception:  # a broken EXIF block must not make the picture unreadable
        return im
    if orientation not in (2, 3, 4, 5, 6, 7, 8):
        return im
    return ImageOps.exif_transpose(im) or im


def _scale_to_uint8(arr: np.ndarray, mode: str) -> np.ndarray:
    """High bit depth / float grey values as uint8 (see the module doc for the rule)."""
    if np.issubdtype(arr.dtype, np.unsignedinteger) and arr.dtype.itemsize == 2:
        return np.round(arr.astype(np.float64) / 257.0).astype(np.uint8)
    a = arr.astype(np.float64)
    finite = np.isfinite(a)
    if not finite.all():
        a = np.where(finite, a, 0.0)
    lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    if mode == "F" and lo >= 0.0 and hi <= 1.0:
        a = a * 255.0
    elif lo >= 0.0 and hi <= 255.0:
        pass
    elif mode != "F" and lo >= 0.0 and hi <= 65535.0:
        a = a / 257.0
    else:
        a = (a - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(a)
    return np.clip(np.round(a), 0, 255).astype(np.uint8)


def _on_background(rgba: Image.Image) -> Image.Image:
    base = Image.new("RGBA", rgba.size, BACKGROUND + (255,))
    return Image.alpha_composite(base, rgba).convert("RGB")


def _grey_high_depth(im: Image.Image) -> Image.Image:
    """An ``I*`` / ``F`` image as RGB, its colour-key transparency (an int) on white."""
    arr = np.asarray(im)
    if arr.ndim == 3:  # a multi-channel high-depth buffer: keep the first channel
        arr = arr[..., 0]
    grey = Image.fromarray(_scale_to_uint8(arr, im.mode), "L")
    key = im.info.get("transparency")
    if isinstance(key, (int, float)) and not isinstance(key, bool):
        alpha = Image.fromarray(np.where(arr == key, 0, 255).astype(np.uint8), "L")
        return _on_background(Image.merge("RGBA", (grey, grey, grey, alpha)))
    return grey.convert("RGB")


def to_rgb(im: Image.Image) -> Image.Image:
    """``im`` as 8-bit RGB as a person sees it: upright (EXIF), first frame, high bit depth scaled,
    transparency on white (see the module doc). May return ``im`` itself when it is already that;
    seeks an animation to its first frame."""
    im = _orient(_first_frame(im))
    mode = im.mode
    if mode == "RGB" and "transparency" not in im.info:
        return im
    if mode.startswith("I") or mode == "F":
        return _grey_high_depth(im)
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info:
        return _on_background((im.convert("LA") if mode == "La" else im).convert("RGBA"))
    if mode == "LAB":
        from PIL import ImageCms

        return ImageCms.applyTransform(im, ImageCms.buildTransform(
            ImageCms.createProfile("LAB"), ImageCms.createProfile("sRGB"), "LAB", "RGB"))
    return im.convert("RGB")


def open_rgb(source: str | Path | bytes) -> Image.Image:
    """The image at path ``source`` (or in raw bytes) via :func:`to_rgb`, fully loaded and its file
    closed. Raises :class:`ImageReadError` (a ``ValueError``) naming the file when it cannot be read."""
    name = "<bytes>" if isinstance(source, (bytes, bytearray, memoryview)) else str(source)
    try:
        fp = io.BytesIO(bytes(source)) if name == "<bytes>" else Path(source)
        with Image.open(fp) as f:
            out = to_rgb(f)
            out = f.copy() if out is f else out
            out.load()
    except MemoryError:
        raise
    except FileNotFoundError:
        raise ImageReadError(f"cannot read image {name}: file not found", None if name == "<bytes>" else name) \
            from None
    except Exception as exc:  # Pillow raises many types for corrupt or unsupported data
        raise ImageReadError(f"cannot read image {name}: {type(exc).__name__}: {exc}",
                             None if name == "<bytes>" else name) from exc
    return out
