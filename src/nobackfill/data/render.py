"""Pixels of a world scene: 64x64 RGB, shapes with colours, sizes, textures and a background.

Pure NumPy; about 0.1 ms per scene, so training can sample fresh scenes every step.
"""

from __future__ import annotations

import numpy as np

from .scene import BACKGROUND_RGB, COLOUR_RGB, SIZE_RADIUS, Scene, SceneObject

CANVAS = 64
_YY, _XX = np.mgrid[0:CANVAS, 0:CANVAS].astype(np.float32) + 0.5


def _shape_mask(o: SceneObject, u: np.ndarray, v: np.ndarray, radius: float) -> np.ndarray:
    """Boolean mask of ``o.shape`` in object-local rotated coordinates ``u`` (right), ``v`` (down)."""
    R = radius
    r = np.hypot(u, v)
    s = o.shape
    if s == "circle":
        return r <= R
    if s == "ring":
        return (r <= R) & (r >= 0.55 * R)
    if s == "square":
        return np.maximum(np.abs(u), np.abs(v)) <= 0.82 * R
    if s == "diamond":
        return np.abs(u) + np.abs(v) <= R
    if s == "triangle":
        return (v <= 0.75 * R) & (np.abs(u) <= (v + R) * (0.95 / 1.75))
    if s == "cross":
        return ((np.abs(u) <= 0.3 * R) & (np.abs(v) <= R)) | ((np.abs(v) <= 0.3 * R) & (np.abs(u) <= R))
    if s == "star":
        theta = np.arctan2(u, -v)
        return r <= R * (0.55 + 0.45 * np.cos(5 * theta))
    if s == "hexagon":
        return np.max(
            np.stack([np.abs(u * np.cos(a) + v * np.sin(a)) for a in (0.0, np.pi / 3, 2 * np.pi / 3)]), axis=0
        ) <= 0.87 * R
    raise ValueError(f"unknown shape {s!r}")


def _texture_mask(texture: str, x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """Where the texture's second colour shows (None for plain)."""
    if texture == "plain":
        return None
    xi, yi = x.astype(np.int32), y.astype(np.int32)
    if texture == "striped":
        return ((xi + yi) // 3) % 2 == 0
    if texture == "dotted":
        return ((xi % 4) < 2) & ((yi % 4) < 2)
    if texture == "checkered":
        return ((xi // 4 + yi // 4) % 2) == 0
    raise ValueError(f"unknown texture {texture!r}")


def _second_colour(rgb: tuple[int, int, int]) -> np.ndarray:
    c = np.asarray(rgb, dtype=np.float32)
    lum = 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]
    return c * 0.45 if lum > 90 else np.minimum(c + 110.0, 255.0)


def render_scene(scene: Scene, noise_rng: np.random.Generator | None = None) -> np.ndarray:
    """Render ``scene`` to a ``(64, 64, 3)`` uint8 array. ``noise_rng`` adds mild pixel noise."""
    img = np.empty((CANVAS, CANVAS, 3), dtype=np.float32)
    img[:] = np.asarray(BACKGROUND_RGB[scene.background], dtype=np.float32)
    for o in scene.objects:
        radius = SIZE_RADIUS[o.size]
        cx, cy = o.x * CANVAS, o.y * CANVAS
        x0, x1 = max(0, int(cx - radius - 2)), min(CANVAS, int(cx + radius + 3))
        y0, y1 = max(0, int(cy - radius - 2)), min(CANVAS, int(cy + radius + 3))
        xs, ys = _XX[y0:y1, x0:x1], _YY[y0:y1, x0:x1]
        dx, dy = xs - cx, ys - cy
        cr, sr = np.cos(o.rotation), np.sin(o.rotation)
        u, v = cr * dx + sr * dy, -sr * dx + cr * dy
        mask = _shape_mask(o, u, v, radius)
        patch = img[y0:y1, x0:x1]
        patch[mask] = np.asarray(COLOUR_RGB[o.colour], dtype=np.float32)
        tex = _texture_mask(o.texture, xs, ys)
        if tex is not None:
            patch[mask & tex] = _second_colour(COLOUR_RGB[o.colour])
    if noise_rng is not None:
        img += noise_rng.normal(0.0, 6.0, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)
