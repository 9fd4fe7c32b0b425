"""Fast stand-ins for collection / searcher tests: deterministic hash encoders, related spaces, a
Procrustes upgrade directory, small image folders."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from nobackfill.encoders.base import DualEncoder, l2_normalise

OLD_REF, NEW_REF, NEWER_REF = "/fake/models/old", "/fake/models/new", "/fake/models/newer"


def _unit(data: bytes, dim: int, salt: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(salt.encode() + data).digest()[:8], "little")
    return l2_normalise(np.random.default_rng(seed).standard_normal(dim).astype(np.float32))


class HashEncoder(DualEncoder):
    """A text or image -> a random unit vector seeded by its content; ``mix`` (``(d_base, dim)``)
    maps a base encoder's vectors into this space, so spaces can be made related."""

    kind = "hash"

    def __init__(self, dim: int = 16, salt: str = "v1", *, base: "HashEncoder | None" = None,
                 mix: np.ndarray | None = None, modalities: Sequence[str] = ("image", "text"), name: str = "") -> None:
        self._dim, self._salt, self.base, self.mix = dim, salt, base, mix
        self.modalities = tuple(modalities)
        self.name = name or f"hash-{salt}"
        self.calls = 0

    @property
    def embed_dim(self) -> int:
        return self._dim

    @property
    def space_id(self) -> str:
        return "hash-" + hashlib.sha256(f"{self._dim}/{self._salt}".encode()).hexdigest()[:16]

    def _rows(self, datas: list[bytes], what: str) -> np.ndarray:
        self.calls += 1
        if what not in self.modalities:
            raise NotImplementedError(f"{self.name} embeds no {what}s")
        if self.base is not None:
            raw = self.base._rows(datas, what) @ self.mix
            return l2_normalise(raw.astype(np.float32))
        rows = [_unit(d, self._dim, f"{self._salt}/{what}") for d in datas]
        return np.stack(rows) if rows else np.zeros((0, self._dim), np.float32)

    def encode_images(self, images, batch_size: int = 128, progress: bool = False) -> np.ndarray:
        datas = []
        for p in images:
            im = p if isinstance(p, Image.Image) else Image.open(p)
            datas.append(im.convert("RGB").tobytes())
        return self._rows(datas, "image")

    def encode_texts(self, texts, batch_size: int = 256, progress: bool = False) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("a sequence of texts, please")
        return self._rows([t.encode() for t in texts], "text")

    def save(self, directory):  # pragma: no cover
        raise NotImplementedError


def related_pair(d_old: int = 12, d_new: int = 16, seed: int = 0) -> tuple[HashEncoder, HashEncoder, np.ndarray]:
    """(old, new, W): ``new(x) = old(x) @ A`` for a matrix ``A`` with orthonormal rows, so ``W = A.T``
    maps new vectors back onto old ones exactly (a perfect bridge)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d_new, d_new)))
    a = q[:d_old].astype(np.float32)  # (d_old, d_new), orthonormal rows
    old = HashEncoder(d_old, "old", name="old")
    new = HashEncoder(d_new, "new", base=old, mix=a, name="new")
    return old, new, a.T.copy()


def write_procrustes_upgrade(directory: Path, w: np.ndarray, source: HashEncoder, target: HashEncoder) -> Path:
    from nobackfill.compat.bridges import ProcrustesBridge
    from nobackfill.compat.upgrade import save_vector_upgrade, space_info

    b = ProcrustesBridge(w, source.space_id, target.space_id)
    return save_vector_upgrade(directory, b, space_info(source), space_info(target), recipe={"command": "test"})


def make_folder(root: Path, n_images: int = 6, captions_per_image: int = 2, extra_images: int = 0,
                seed: int = 0) -> Path:
    """A data folder: ``n_images`` PNGs with captions, plus ``extra_images`` without any."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n_images + extra_images):
        arr = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(arr).save(root / "images" / f"{i:03d}.png")
        if i < n_images:
            for c in range(captions_per_image):
                lines.append({"image": f"images/{i:03d}.png", "caption": f"caption {c} of image {i} seed {seed}",
                              "lang": "en", "labels": {"n": i}})
    (root / "captions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return root


def upgraded_collection(root: Path, n_images: int = 6, captions: int = 2, uri: str | Path | None = None):
    """A collection of a :func:`make_folder` under ``root`` (at ``uri``, default ``root / "c"``),
    embedded by the old hash model and upgraded to the new one through a Procrustes bridge (nothing
    backfilled): ``(collection, old, new, pool, data folder)``."""
    from nobackfill.collection.collection import Collection
    from nobackfill.collection.ingest import add_items, folder_items
    from nobackfill.lifecycle.plan_changes import upgrade_collection

    old, new, w = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    data = make_folder(root / "data", n_images=n_images, captions_per_image=captions)
    c = Collection.create(uri or root / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    upgrade_collection(c, NEW_REF, bridges=[write_procrustes_upgrade(root / "up", w, new, old)], pool=pool)
    return c, old, new, pool, data


def pool_with(*pairs) -> "object":
    """A ModelPool pre-loaded with ``(ref, encoder)`` pairs."""
    from nobackfill.search import ModelPool

    pool = ModelPool()
    for ref, enc in pairs:
        pool.put(ref, enc)
    return pool


def milvus_server_location(request) -> str:
    """A fresh collection on the session's Milvus server (the ``milvus_server`` fixture), its
    catalog in a fresh PostgreSQL database (``postgres_db``: a Milvus server keeps no catalog of its
    own)."""
    import uuid

    server = request.getfixturevalue("milvus_server")
    name = f"c{uuid.uuid4().hex[:8]}"
    return f"milvus://{server}#{name}?catalog={request.getfixturevalue('postgres_db')}#{name}"


ADMIN, READ = "a" * 20, "r" * 20


def served_old_collection(tmp_path: Path, data: Path):
    """A collection of ``data`` embedded by the old model of :func:`related_pair`, served by an app
    (FastAPI's TestClient) whose ``--models-root`` holds the new model as ``new``: ``(api, collection,
    old, new)``; keys :data:`ADMIN` and :data:`READ`."""
    from fastapi.testclient import TestClient

    from nobackfill.collection.collection import Collection
    from nobackfill.collection.ingest import add_items, folder_items
    from nobackfill.serve import KeyRing, ServeSettings, create_app

    old, new, _ = related_pair()
    model = tmp_path / "models" / "new"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    pool = pool_with((OLD_REF, old), (str(model.resolve()), new))
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    settings = ServeSettings(collection=str(c.path), keys=KeyRing({"read": [READ], "admin": [ADMIN]}),
                             models_root=tmp_path / "models", upgrades_root=tmp_path / "upgrades")
    (tmp_path / "upgrades").mkdir()
    return TestClient(create_app(settings, pool=pool)), c, old, new
