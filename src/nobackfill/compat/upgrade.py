"""Upgrade directories: what an operator ships to serve a new model against an old gallery.

Layout (Hugging Face style; everything small, the base models are referenced by space id, never
copied)::

    upgrade.json                 {"format": "nobackfill-upgrade", "version": 1, "kind": ...,
                                  "source": {"space_id", "name", "embed_dim"},   (the new model)
                                  "target": {"space_id", "name", "embed_dim"},   (the gallery's space)
                                  "phi": {...}, "adapters": {...}, "recipe": {...}}
    adapter_model.safetensors    LoRA / prompt / LayerNorm tensors        (kinds xbt, xbt-text, direct-*)
    adapter_config.json          peft LoraConfig (+ "nobackfill": our AdapterConfig)
    phi.safetensors, phi_config.json                                     (kinds xbt, xbt-text, direct-*, phi)
    procrustes.safetensors                                               (kind procrustes)
    fitted.safetensors           a bridge fitted on backfilled pairs     (kind fitted: compat.fitted)
    encoder/                     a full fine-tuned model                 (kind direct-full only)

Kinds: ``xbt`` (Sec. 3.3), ``xbt-text`` (the same recipe on a text-only BERT-style model, e.g.
all-MiniLM-L6-v2 -> the Multi30K old text model: Eq. 5 with a second caption in place of the
image, :mod:`.text_upgrade`), ``direct-lora`` / ``direct-base`` / ``direct-full`` (Eq. 6
baselines), ``phi`` (stage 1 only, Eq. 3: a vector bridge), ``procrustes`` (a vector bridge) and
``fitted`` (a vector bridge fitted on a collection's own backfilled pairs, :mod:`.fitted`).

``load_upgrade(dir)`` reads one; ``upgrade.apply(new_encoder)`` gives an :class:`UpgradedEncoder`
that embeds the new model's inputs into the target (old) space, and ``enabled = False`` gives
back the original new model bit for bit. Vector kinds give a bridge (``upgrade.bridge()``) applied
to the new model's vectors. The query pipeline (:func:`nobackfill.search.searcher.query_side_for`,
the searcher's routes) hides the difference.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..encoders.base import DualEncoder
from ..gallery.atomic_files import read_tagged_json
from ..gallery.types import SpaceMismatchError
from ..progress import progress_bar
from .adapters import AdapterConfig, Adapters
from .bridges import PhiBridge, ProcrustesBridge
from .phi import Projection
from .upgrade_files import FORMAT, KINDS, TEXT_KINDS, UPGRADE_FILE, VECTOR_KINDS, VERSION, atomic_dir, write_manifest



def space_info(encoder: DualEncoder, space_id: str | None = None, dim: int | None = None) -> dict:
    return {"space_id": space_id or encoder.space_id, "name": str(getattr(encoder, "name", "")),
            "embed_dim": int(dim or encoder.embed_dim)}


class UpgradedEncoder(DualEncoder):
    """A new CLIP model plus its upgrade: on, it embeds into the target (old) space
    (``phi(E_new(x))`` with adapters active, Eq. 4); off, it *is* the original new model.

    ``base`` is the new :class:`~nobackfill.encoders.CLIPDualEncoder` whose model carries the
    ``adapters`` (switched on and off here, per call); ``off_space`` is the base's space id
    *before* the adapters were attached.
    """

    kind = "upgraded"

    def __init__(self, base, phi: Projection, adapters: Adapters | None, *, source: str, target: str,
                 off_space: str | None = None, enabled: bool = True, upgrade_kind: str = "xbt",
                 meta: dict | None = None) -> None:
        self.base, self.phi, self.adapters = base, phi, adapters
        self.source, self.target = source, target
        self._off_space = off_space
        self.enabled = bool(enabled)
        self.upgrade_kind = upgrade_kind
        self.meta = dict(meta or {})

    # ----------------------------------------------------------------- identity
    @property
    def name(self) -> str:
        return f"{getattr(self.base, 'name', 'new')}+{self.upgrade_kind}"

    @property
    def embed_dim(self) -> int:
        return self.phi.out_dim if self.enabled else self.base.embed_dim

    @property
    def modalities(self) -> tuple[str, ...]:
        return tuple(getattr(self.base, "modalities", ("image", "text")))

    @property
    def off_space(self) -> str:
        """The space of the outputs when switched off: the original new model's (adapters), or the
        fine-tuned model's own fingerprint (``direct-full``)."""
        return self._off_space or self.base.space_id

    @property
    def space_id(self) -> str:
        return self.target if self.enabled else self.off_space

    @property
    def preprocessor(self):
        return self.base.preprocessor

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        return self.base.tokenize(texts)

    def merged(self) -> "UpgradedEncoder":
        """The same upgrade with its adapters merged into a copy of the model, for serving: equal
        outputs, faster queries (no LoRA branches, no switchable wrappers); cannot be switched off.
        This encoder is left as it is."""
        import copy

        if self.adapters is None:
            return self
        base = copy.copy(self.base)
        base.model = self.adapters.merged_model()
        out = type(self)(base, self.phi, None, source=self.source, target=self.target, off_space=None, enabled=True,
                         upgrade_kind=self.upgrade_kind, meta={**self.meta, "merged": True})
        out._merged = True
        return out

    @contextlib.contextmanager
    def switched(self, enabled: bool) -> Iterator["UpgradedEncoder"]:
        if not enabled and getattr(self, "_merged", False):
            raise ValueError(f"{self.name}: a merged upgrade cannot be switched off (keep the unmerged one)")
        prev = self.enabled
        self.enabled = bool(enabled)
        try:
            yield self
        finally:
            self.enabled = prev

    def _sync(self) -> None:
        if self.adapters is not None and self.adapters.enabled != self.enabled:
            self.adapters.set_enabled(self.enabled)

    def train(self, training: bool = True) -> None:
        self.base.model.train(training)
        self.phi.train(training)

    # ----------------------------------------------------------------- differentiable features
    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Unit rows: ``phi(v_new)`` when on (Eq. 4), the normalised new embedding when off."""
        self._sync()
        v = F.normalize(self.base.image_features(pixel_values), dim=-1)
        return self.phi(v) if self.enabled else v

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self._sync()
        w = F.normalize(self.base.text_features(input_ids, attention_mask), dim=-1)
        return self.phi(w) if self.enabled else w

    # ----------------------------------------------------------------- inference
    def encode_images(self, images, batch_size: int = 128, progress: bool = False) -> np.ndarray:
        self._sync()
        if not self.enabled:
            return self.base.encode_images(images, batch_size=batch_size, progress=progress)
        out, n = [], len(images)
        with torch.inference_mode(), progress_bar(progress, "encode images", n) as advance:
            for s in range(0, n, batch_size):
                pv = self.base.preprocessor(images[s:s + batch_size])
                out.append(self.image_features(pv).float().numpy())
                advance(min(batch_size, n - s))
        return np.concatenate(out) if out else np.zeros((0, self.embed_dim), np.float32)

    def encode_texts(self, texts, batch_size: int = 256, progress: bool = False) -> np.ndarray:
        self._sync()
        if not self.enabled:
            return self.base.encode_texts(texts, batch_size=batch_size, progress=progress)
        out, n = [], len(texts)
        with torch.inference_mode(), progress_bar(progress, "encode texts", n) as advance:
            for s in range(0, n, batch_size):
                enc = self.base.tokenize(texts[s:s + batch_size])
                out.append(self.text_features(**enc).float().numpy())
                advance(min(batch_size, n - s))
        return np.concatenate(out) if out else np.zeros((0, self.embed_dim), np.float32)

    # ----------------------------------------------------------------- persistence
    def save(self, directory: str | Path, recipe: dict | None = None) -> Path:
        """Write the upgrade directory (not the base model)."""
        target_info = dict(self.meta.get("target") or {"space_id": self.target, "name": "", "embed_dim": self.phi.out_dim})
        source_info = dict(self.meta.get("source") or {"space_id": self.source, "name": getattr(self.base, "name", ""),
                                                       "embed_dim": self.base.embed_dim})

        def write(tmp: Path) -> None:
            self.phi.save(tmp)
            if self.adapters is not None:
                self.adapters.save(tmp)
            if self.upgrade_kind == "direct-full":
                self.base.save(tmp / "encoder")
            write_manifest(tmp, self.upgrade_kind, source_info, target_info, phi=self.phi.config(),
                           adapters=self.adapters.cfg.to_dict() if self.adapters is not None else None,
                           recipe=recipe or self.meta.get("recipe"))

        return atomic_dir(directory, write)


class TextUpgradedEncoder(UpgradedEncoder):
    """An :class:`UpgradedEncoder` over a text-only model (kind ``xbt-text``, e.g.
    all-MiniLM-L6-v2 + LoRA + LayerNorms + phi): ``encode_texts`` gives ``phi(w_new)`` in the old
    text model's space (Eq. 4, text side), switched off the original new model bit for bit.
    Images are refused: the model has no image tower."""

    def _no_images(self):
        where = self.meta.get("directory")
        raise NotImplementedError(f"{self.name} is a text-only upgrade{f' ({where})' if where else ''}: the model "
                                  f"{getattr(self.base, 'name', 'new')!r} has no image tower, it cannot embed images")

    @property
    def preprocessor(self):
        self._no_images()

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        self._no_images()

    def encode_images(self, images, batch_size: int = 128, progress: bool = False) -> np.ndarray:
        self._no_images()

    def image_tokens(self, images):
        self._no_images()


def _upgraded_class(kind: str) -> type[UpgradedEncoder]:
    return TextUpgradedEncoder if kind in TEXT_KINDS else UpgradedEncoder


def save_vector_upgrade(directory: str | Path, bridge, source: dict, target: dict,
                        recipe: dict | None = None) -> Path:
    """Write a ``phi`` or ``procrustes`` upgrade directory."""

    def write(tmp: Path) -> None:
        if isinstance(bridge, PhiBridge):
            bridge.phi.save(tmp)
            write_manifest(tmp, "phi", source, target, phi=bridge.phi.config(), recipe=recipe)
        elif isinstance(bridge, ProcrustesBridge):
            bridge.save(tmp)
            write_manifest(tmp, "procrustes", source, target, recipe=recipe)
        else:
            raise TypeError(f"cannot save a {type(bridge).__name__} as an upgrade")

    return atomic_dir(directory, write)


@dataclass
class Upgrade:
    """A loaded upgrade directory (see the module doc)."""

    directory: Path
    kind: str
    source: dict
    target: dict
    manifest: dict = field(default_factory=dict)

    @property
    def source_id(self) -> str:
        return self.source["space_id"]

    @property
    def target_id(self) -> str:
        return self.target["space_id"]

    @property
    def is_bridge(self) -> bool:
        return self.kind in VECTOR_KINDS

    def check_files(self) -> list[str]:
        """Problems with the files ``upgrade.json`` lists (missing, or another sha256). Upgrades saved
        before the manifest kept hashes list none (their tensors are still checked as they load)."""
        from ..gallery.atomic_files import file_sha256

        problems = []
        for rel, digest in (self.manifest.get("files") or {}).items():
            path = self.directory / rel
            try:
                if file_sha256(path) != digest:
                    problems.append(f"{path}: sha256 differs from {self.directory / UPGRADE_FILE} (changed or damaged; "
                                    "train or copy the upgrade again)")
            except OSError as e:
                problems.append(f"{path}: {e.strerror or e} (listed in {self.directory / UPGRADE_FILE})")
        return problems

    def _checked(self) -> None:
        problems = self.check_files()
        if problems:
            raise ValueError("; ".join(problems))

    def _load(self, what: str, fn):
        """Run a loader of this directory's files; any failure names the directory and the part."""
        try:
            return fn()
        except (ValueError, FileNotFoundError, SpaceMismatchError):
            raise
        except Exception as e:  # safetensors' SafetensorError, torch's size-mismatch RuntimeError, ...
            raise ValueError(f"{self.directory}: cannot load its {what}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0][:300]}") from None

    def bridge(self):
        """The vector bridge of a ``phi`` / ``procrustes`` / ``fitted`` upgrade."""
        self._checked()
        if self.kind == "phi":
            return PhiBridge(self._load("phi (phi.safetensors, phi_config.json)", lambda: Projection.load(self.directory)),
                             self.source_id, self.target_id, name=self.directory.name)
        if self.kind == "procrustes":
            b = self._load("procrustes.safetensors",
                           lambda: ProcrustesBridge.load(self.directory, self.source_id, self.target_id))
            b.name = self.directory.name
            return b
        if self.kind == "fitted":
            from .fitted.bridge import FittedBridge

            return self._load("fitted.safetensors", lambda: FittedBridge.load(
                self.directory, self.source_id, self.target_id, self.manifest.get("fitted")))
        raise TypeError(f"{self.directory}: a {self.kind!r} upgrade changes the encoder; use .apply(encoder)")

    def _check_source(self, encoder: DualEncoder) -> str:
        sid = encoder.space_id
        if sid != self.source_id:
            raise SpaceMismatchError(self.source_id, sid, f"apply upgrade {self.directory}", what="given model's embeddings",
                                     expected="upgrade's source (the new model it was trained for)",
                                     expected_name=self.source.get("name", ""), other_name=getattr(encoder, "name", ""),
                                     hint=f"its target is the gallery space {self.target_id} "
                                          f"({self.target.get('name', '')}); give the model it was trained for")
        return sid

    def apply(self, encoder, enabled: bool = True) -> UpgradedEncoder:
        """Attach this upgrade to the new model ``encoder`` (modified in place: its model gets the
        switchable adapters) and return the :class:`UpgradedEncoder`."""
        if self.is_bridge:
            raise TypeError(f"{self.directory}: a {self.kind!r} upgrade is a vector bridge; use .bridge()")
        sid = self._check_source(encoder)
        self._checked()
        phi = self._load("phi (phi.safetensors, phi_config.json)", lambda: Projection.load(self.directory))
        meta = {"source": self.source, "target": self.target, "recipe": self.manifest.get("recipe")}
        if self.kind == "direct-full":
            from ..encoders import load_encoder

            tuned = load_encoder(self.directory / "encoder")
            return UpgradedEncoder(tuned, phi, None, source=sid, target=self.target_id, off_space=None,
                                   enabled=enabled, upgrade_kind=self.kind, meta=meta)
        if self.kind in TEXT_KINDS:
            meta["directory"] = str(self.directory)
        try:
            adapters = Adapters(encoder.model, Adapters.read_config(self.directory))
        except ValueError as e:
            raise ValueError(f"{self.directory}: {e}") from None
        self._load("adapters (adapter_model.safetensors, adapter_config.json)", lambda: adapters.load(self.directory))
        encoder.model.eval()
        up = _upgraded_class(self.kind)(encoder, phi.eval(), adapters, source=sid, target=self.target_id,
                                        off_space=sid, enabled=enabled, upgrade_kind=self.kind, meta=meta)
        up._sync()
        return up


def load_upgrade(directory: str | Path) -> Upgrade:
    """Read an upgrade directory (validates the manifest)."""
    d = Path(directory)
    path = d / UPGRADE_FILE
    if not path.is_file():
        why = "no such directory" if not d.exists() else "a file, not an upgrade directory" if not d.is_dir() else \
            f"not an upgrade directory (no {UPGRADE_FILE})"
        raise FileNotFoundError(f"{d}: {why}")
    m = read_tagged_json(path, FORMAT, max_version=VERSION)
    kind = m.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{path}: unknown kind {kind!r}; kinds: {KINDS}")
    for side in ("source", "target"):
        if not isinstance(m.get(side), dict) or not m[side].get("space_id"):
            raise ValueError(f"{path}: missing {side}.space_id")
    return Upgrade(d, kind, m["source"], m["target"], m)


def new_upgraded_encoder(new, phi: Projection, target: dict, adapter_cfg: AdapterConfig | None,
                         kind: str = "xbt") -> UpgradedEncoder:
    """Attach fresh adapters (``adapter_cfg``) to the new model for training. ``adapter_cfg=None``
    means no adapters: the new model itself will be fine-tuned (``direct-full``; its off space is
    then its own, changing, fingerprint)."""
    if kind not in KINDS:
        raise ValueError(f"unknown upgrade kind {kind!r}; kinds: {KINDS}")
    sid = new.space_id
    adapters = Adapters(new.model, adapter_cfg) if adapter_cfg is not None else None
    return _upgraded_class(kind)(new, phi, adapters, source=sid, target=target["space_id"],
                                 off_space=sid if adapters is not None else None,
                                 upgrade_kind=kind, meta={"source": space_info(new, sid), "target": target})

