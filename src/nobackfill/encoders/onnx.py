"""Query encoders on ONNX Runtime: a model's towers exported once, checked against torch, and served.

:func:`export_onnx` writes ``<model>/onnx/``: ``text.onnx`` (and ``image.onnx`` for a model with an
image tower), exported with dynamic batch and sequence axes, each tower's L2-normalised output
compared with torch's on texts of several lengths and batch sizes (refused above ``1e-4`` max abs
difference in fp32), and ``export.json`` (the model's space id, each file's sha256 and measured
difference). A CLIP text tower is written as :mod:`.onnx_clip`'s graph (fused attention, the last
layer for the pooled token only), any other tower by tracing. ``int8=True`` adds dynamically
quantised copies (``*.int8.onnx``), reported with their difference but never used unless asked for
(:func:`onnx_encoder` with ``int8=True``). The differences recorded are measured on the export's
check inputs (``checked_on``: a few texts, seeded random-noise images): on real inputs int8 differs
more, and an int8 vector depends on the other inputs of its batch (``nobackfill bench serve``
measures both on the world test split). An export of some towers keeps the earlier export's other
towers where they were exported from the same weights and their files are unchanged.

:func:`onnx_encoder` wraps a loaded :class:`~nobackfill.encoders.base.DualEncoder`: when
``onnxruntime`` is installed and ``<model>/onnx/export.json`` names this model's space id (the same
weights the export was checked on), its ``encode_texts`` / ``encode_images`` run the exported
towers; everything else (tokens, saving, the space id) is the wrapped encoder's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from .base import DualEncoder, l2_normalise
from .onnx_clip import OPSET as CLIP_OPSET

log = logging.getLogger(__name__)

__all__ = ["EXPORT_DIR", "GRAPHS", "MAX_ABS_DIFF", "OnnxEncoder", "export_onnx", "onnx_encoder", "onnx_export_info"]

#: the folder beside the model's files
EXPORT_DIR = "onnx"
#: the largest difference from torch an fp32 export may show
MAX_ABS_DIFF = 1e-4
#: the ONNX opset of a traced tower
TRACED_OPSET = 17
#: how a text tower is written: ``auto`` (a CLIP text tower as :mod:`.onnx_clip`'s graph) or ``traced``
GRAPHS = ("auto", "traced")
#: texts the export is checked on (several lengths, so the dynamic sequence axis is exercised)
CHECK_TEXTS = ["a", "a red circle", "a photo of a small green triangle next to a large blue square on the left",
               "two yellow crosses", "ein rotes Quadrat", "un triangle bleu", "x " * 30, "purple diamond at the top"]


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        if hasattr(hashlib, "file_digest"):  # Python >= 3.11: read in blocks
            return hashlib.file_digest(f, "sha256").hexdigest()
        return hashlib.sha256(f.read()).hexdigest()


def _tower(encoder: Any, tower: str) -> Any:
    """The torch module exported for ``tower``: ``l2(text_features(ids, mask))`` or
    ``l2(image_features(pixel_values))`` of ``encoder`` (its model registered, so export sees the weights)."""
    import torch

    features = encoder.text_features if tower == "text" else encoder.image_features

    class Tower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder_model = encoder.model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.normalize(features(*inputs), dim=-1)

    return Tower().eval()


def _text_batch(encoder: Any, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Token ids and attention mask of ``texts``, tokenised and padded as the torch encoder does."""
    ids = encoder.tokenizer(list(texts), truncation=True, max_length=encoder.max_length)["input_ids"]
    batch = encoder._pad(ids)
    return {"input_ids": batch["input_ids"].numpy(), "attention_mask": batch["attention_mask"].numpy()}


def _check_images(encoder: Any) -> np.ndarray:
    """A few seeded random images, preprocessed as the encoder does (pixel values, float32)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    size = int(encoder.preprocessor.size) if hasattr(encoder.preprocessor, "size") else 224
    imgs = [Image.fromarray(rng.integers(0, 256, (size + 7 * i, size, 3), dtype=np.uint8)) for i in range(3)]
    return encoder.preprocessor(imgs).numpy()


def _session(path: Path, threads: int | None = None, spin: bool = False) -> Any:
    """An ONNX Runtime CPU session of ``path`` on ``threads`` intra-op threads (None: its default, the
    cores, spinning). Given ``threads``, its idle threads sleep unless ``spin`` (they wait for the next
    operator busily, as torch's OpenMP threads do: faster for one query, at the cost of a core kept
    busy between operators)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = int(threads)
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _export(module: Any, arrays: tuple, names: list[str], axes: dict[str, dict[int, str]], path: Path) -> None:
    """``module`` traced on ``arrays`` (numpy) into ``path``, with ``axes`` dynamic."""
    import torch

    args = tuple(torch.from_numpy(a) for a in arrays)
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(module, args, str(path), input_names=names, output_names=["embedding"],
                          dynamic_axes={**axes, "embedding": {0: "batch"}}, opset_version=TRACED_OPSET, dynamo=False)


def _quantize(src: Path, dst: Path) -> None:
    """``src``'s weights quantised to int8 (onnxruntime's dynamic quantisation) into ``dst``."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process goes to the root logger
    try:
        # DefaultTensorType: outputs of contrib ops (Attention, QuickGelu) have no inferred type; all are float
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": 1})
    finally:
        root.setLevel(level)


def _max_diff(module: Any, session: Any, feeds: list[dict[str, np.ndarray]]) -> float:
    """The largest |torch - onnxruntime| over the check batches."""
    import torch

    worst = 0.0
    for feed in feeds:
        with torch.inference_mode():
            ref = module(*[torch.from_numpy(v) for v in feed.values()]).float().numpy()
        out = session.run(None, feed)[0]
        worst = max(worst, float(np.abs(ref - out).max()))
    return worst


def _checked_on(tower: str, feeds: list[dict[str, np.ndarray]]) -> str:
    """What ``tower``'s recorded differences were measured on."""
    sizes = [len(next(iter(f.values()))) for f in feeds]
    what = "check texts" if tower == "text" else "seeded random-noise images"
    shown = [str(n) for n in sizes]
    batches = f"{', '.join(shown[:-1])} and {shown[-1]}" if len(shown) > 1 else shown[0]
    return f"the export's check inputs: {max(sizes)} {what}, in batches of {batches}"


def _copy_checked(parent: Path, entry: dict[str, Any], tmp: Path) -> bool:
    """``entry``'s file of the earlier export (in ``parent``) into ``tmp`` (a hard link where it can),
    if it is there and its sha256 is the one recorded; False (nothing left in ``tmp``) otherwise."""
    name = str(entry.get("file", ""))
    src, dst = parent / name, tmp / name
    if not name or Path(name).name != name or name == "export.json" or not src.is_file() or dst.exists():
        return False
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    if _sha256(dst) != entry.get("sha256"):
        dst.unlink()
        return False
    return True


def _keep_earlier(parent: Path, earlier: dict[str, Any] | None, encoder: Any, towers: Sequence[str],
                  tmp: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The earlier export's towers (in ``parent``, recorded in ``earlier``) that are not in ``towers``,
    copied into ``tmp`` where they were exported from ``encoder``'s weights (the same space id) and
    their files are unchanged (sha256 as recorded). Returns ``(their entries, {what: why it is not
    kept})``; an int8 copy that cannot be kept drops only that copy (``what``: ``"<tower> int8"``)."""
    kept: dict[str, Any] = {}
    dropped: dict[str, str] = {w: why for w, why in (earlier or {}).get("unreadable", {}).items()
                               if w.removesuffix(" int8") not in towers}
    for tower, entry in (earlier or {"towers": {}})["towers"].items():
        if tower in towers:
            continue
        if earlier.get("space_id") != encoder.space_id:
            dropped[tower] = "exported from other weights than the model's now"
        elif tower not in encoder.modalities or not isinstance(entry, dict):
            dropped[tower] = f"the model has no {tower} tower" if isinstance(entry, dict) else "unreadable entry"
        elif not _copy_checked(parent, entry, tmp):
            dropped[tower] = f"{entry.get('file')} missing or changed since its export (sha256)"
        else:
            entry = dict(entry)
            if isinstance(entry.get("int8"), dict) and not _copy_checked(parent, entry["int8"], tmp):
                dropped[f"{tower} int8"] = f"{entry['int8'].get('file')} missing or changed since its export (sha256)"
                del entry["int8"]
            kept[tower] = entry
    return kept, dropped


def _write_tower(encoder: Any, tower: str, module: Any, feeds: list[dict[str, np.ndarray]],
                 axes: dict[str, dict[int, str]], path: Path, graph: str, max_abs_diff: float) -> tuple[str, float]:
    """Write ``tower`` to ``path``: the CLIP text graph (:mod:`.onnx_clip`) where ``graph`` is
    ``"auto"`` and it applies and matches torch within ``max_abs_diff``, else the traced module.
    Returns ``(graph written: "clip-text" or "traced", its max abs difference from torch)``."""
    if graph == "auto" and tower == "text":
        import onnx

        from .onnx_clip import clip_text_graph

        proto = clip_text_graph(encoder)
        if proto is not None:
            onnx.save(proto, str(path))
            diff = _max_diff(module, _session(path), feeds)
            if diff <= max_abs_diff:
                return "clip-text", diff
            log.warning("the CLIP text graph differs from torch by %.1e; exporting by tracing instead", diff)
    _export(module, tuple(feeds[-1].values()), list(feeds[0]), axes, path)
    return "traced", _max_diff(module, _session(path), feeds)


def export_onnx(model_dir: str | Path, *, int8: bool = False, towers: Sequence[str] | None = None,
                max_abs_diff: float = MAX_ABS_DIFF, graph: str = "auto") -> dict[str, Any]:
    """Export the model at ``model_dir``'s towers to ``model_dir/onnx/`` and check them (see the
    module docstring); returns what ``export.json`` records. ``graph``: ``"auto"`` writes a CLIP
    text tower as :mod:`.onnx_clip`'s graph (faster at batch 1; the traced export where it does not
    apply), ``"traced"`` traces every tower. Refuses (``ValueError``, nothing written) when a
    tower's fp32 output differs from torch's by more than ``max_abs_diff``; the earlier export, if
    any, is then left as it was. With ``towers``, the earlier export's other towers are kept where they
    were exported from the same weights and their files are unchanged (copied into the new export;
    the returned dict's ``"earlier"``, not written to ``export.json``, says ``{"kept": [towers],
    "dropped": {what: why}}``)."""
    from . import load_encoder, model_directory

    if graph not in GRAPHS:
        raise ValueError(f"graph: one of {', '.join(GRAPHS)}, not {graph!r}")
    model_dir = model_directory(model_dir)  # (a shipped model's name: its directory)
    encoder = load_encoder(model_dir)
    if not hasattr(encoder, "text_features"):
        raise ValueError(f"{model_dir}: {type(encoder).__name__} has no exportable towers")
    towers = list(towers or encoder.modalities)
    unknown = [t for t in towers if t not in encoder.modalities]
    if unknown:
        raise ValueError(f"towers: {model_dir} embeds {list(encoder.modalities)}, not {unknown}")
    info: dict[str, Any] = {"space_id": encoder.space_id, "towers": {}}
    parent = model_dir / EXPORT_DIR
    with _export_lock(model_dir):
        return _export_locked(model_dir, encoder, towers, info, parent, int8, graph, max_abs_diff)


@contextlib.contextmanager
def _export_lock(model_dir: Path) -> Iterator[None]:
    """One export of ``model_dir`` at a time. Holding it, what a killed export left is put right first:
    its staging folders (``.onnx.XXXX``, as large as an export) removed, and an earlier export it had
    set aside (``.onnx.old``) put back when no ``onnx/`` replaced it (trial T). The lock is the model
    directory's own (``flock`` of the directory): a lock file stayed in the user's model folder (trial W)."""
    import fcntl

    fd = os.open(model_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):  # the lock file of earlier versions
            (model_dir / ".export-onnx.lock").unlink()
        old, parent = model_dir / f".{EXPORT_DIR}.old", model_dir / EXPORT_DIR
        if old.is_dir() and not parent.exists():
            os.replace(old, parent)
        for stale in model_dir.glob(f".{EXPORT_DIR}.*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _export_locked(model_dir: Path, encoder: Any, towers: list[str], info: dict[str, Any], parent: Path,
                   int8: bool, graph: str, max_abs_diff: float) -> dict[str, Any]:
    earlier = onnx_export_info(model_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{EXPORT_DIR}.", dir=model_dir))
    try:
        for tower in towers:
            module = _tower(encoder, tower)
            if tower == "text":
                feeds = [_text_batch(encoder, CHECK_TEXTS[:1]), _text_batch(encoder, CHECK_TEXTS[1:4]),
                         _text_batch(encoder, CHECK_TEXTS)]
                axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
            else:
                px = _check_images(encoder)
                feeds = [{"pixel_values": px[:1]}, {"pixel_values": px}]
                axes = {"pixel_values": {0: "batch"}}
            path = tmp / f"{tower}.onnx"
            kind, diff = _write_tower(encoder, tower, module, feeds, axes, path, graph, max_abs_diff)
            if diff > max_abs_diff:
                raise ValueError(f"{model_dir}: the exported {tower} tower differs from torch by {diff:.2e} "
                                 f"(max abs, over {sum(len(next(iter(f.values()))) for f in feeds)} inputs), above "
                                 f"{max_abs_diff:.0e}; not written")
            checked_on = _checked_on(tower, feeds)
            entry = {"file": path.name, "sha256": _sha256(path), "max_abs_diff": diff, "graph": kind,
                     "opset": CLIP_OPSET if kind == "clip-text" else TRACED_OPSET, "checked_on": checked_on}
            if int8:
                qpath = tmp / f"{tower}.int8.onnx"
                _quantize(path, qpath)
                entry["int8"] = {"file": qpath.name, "sha256": _sha256(qpath),
                                 "max_abs_diff": _max_diff(module, _session(qpath), feeds),
                                 "checked_on": checked_on,
                                 "note": "real inputs differ more than the check inputs, and an int8 vector depends "
                                         "on the other inputs of its batch (nobackfill bench serve measures both)"}
            info["towers"][tower] = entry
        kept, dropped = _keep_earlier(parent, earlier, encoder, towers, tmp)
        info["towers"].update(kept)
        (tmp / "export.json").write_text(json.dumps(info, indent=2))
        for what, why in dropped.items():
            log.info("%s: the earlier export's %s is not kept: %s", parent, what, why)
        for f in [tmp, *tmp.iterdir()]:
            os.chmod(f, 0o755 if f.is_dir() else 0o644)
        old = model_dir / f".{EXPORT_DIR}.old"
        if parent.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(parent, old)
        os.replace(tmp, parent)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**info, "earlier": {"kept": list(kept), "dropped": dropped}}


def onnx_export_info(model_dir: str | Path, *, warn: bool = False) -> dict[str, Any] | None:
    """What ``model_dir/onnx/export.json`` records, or None (no export, or unreadable: ``warn``
    logs a warning for one that is there but not an export's record)."""
    path = Path(model_dir) / EXPORT_DIR / "export.json"
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        info, why = None, f"{type(e).__name__}: {e}"
    else:
        why = "not an export's record (no towers)"
    if isinstance(info, dict) and isinstance(info.get("towers"), dict):
        for tower, entry in info["towers"].items():  # an int8 record that is no record: that copy is left out
            if isinstance(entry, dict) and "int8" in entry and not isinstance(entry["int8"], dict):
                if warn:
                    log.warning("%s: its %s tower's int8 record is %r, not an export's; that copy is not used "
                                "(nobackfill export-onnx %s --int8 writes it again)", path, tower, entry["int8"],
                                model_dir)
                info["towers"][tower] = {k: v for k, v in entry.items() if k != "int8"}
                info.setdefault("unreadable", {})[f"{tower} int8"] = "its record is no export's record"
        return info
    if warn:
        log.warning("%s: %s; queries run on torch (nobackfill export-onnx %s writes the export again)", path,
                    why, model_dir)
    return None


class OnnxEncoder(DualEncoder):
    """A :class:`DualEncoder` whose ``encode_texts`` / ``encode_images`` run exported towers on ONNX
    Runtime; every other attribute is the wrapped torch encoder's (its space id included: the export
    was checked against these weights)."""

    def __init__(self, encoder: DualEncoder, sessions: dict[str, Any], files: dict[str, str]) -> None:
        self.encoder = encoder
        self.sessions = sessions
        self.files = files
        self.kind = encoder.kind
        self.modalities = encoder.modalities

    def runtimes(self) -> dict[str, str]:
        """How each tower runs: ``onnx``, ``onnx-int8`` (an exported file) or ``torch``."""
        return {t: ("onnx-int8" if self.files[t].endswith(".int8.onnx") else "onnx") if t in self.files else "torch"
                for t in self.modalities}

    def __getattr__(self, name: str) -> Any:  # tokens, tokenizer, model, save internals: the torch encoder's
        return getattr(self.__dict__["encoder"], name)

    @property
    def embed_dim(self) -> int:
        return self.encoder.embed_dim

    @property
    def space_id(self) -> str:
        return self.encoder.space_id

    def encode_texts(self, texts: Sequence[str], batch_size: int = 256, progress: bool = False) -> np.ndarray:
        if "text" not in self.sessions:
            return self.encoder.encode_texts(texts, batch_size=batch_size, progress=progress)
        if isinstance(texts, str):
            raise TypeError("encode_texts expects a sequence of strings, not one string")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.embed_dim), np.float32)
        out = [self.sessions["text"].run(None, _text_batch(self.encoder, texts[s:s + batch_size]))[0]
               for s in range(0, len(texts), batch_size)]
        return l2_normalise(np.concatenate(out).astype(np.float32, copy=False))

    def encode_images(self, images: Sequence[Any], batch_size: int = 128, progress: bool = False) -> np.ndarray:
        if "image" not in self.sessions:
            return self.encoder.encode_images(images, batch_size=batch_size, progress=progress)
        out = [self.sessions["image"].run(None, {"pixel_values": self.encoder.preprocessor(images[s:s + batch_size])
                                                 .numpy()})[0] for s in range(0, len(images), batch_size)]
        if not out:
            return np.zeros((0, self.embed_dim), np.float32)
        return l2_normalise(np.concatenate(out).astype(np.float32, copy=False))

    def save(self, directory: str | Path) -> Path:
        return self.encoder.save(directory)


def onnx_encoder(encoder: DualEncoder, model_dir: str | Path, *, int8: bool = False,
                 threads: int | None = None, spin: bool = False) -> DualEncoder:
    """``encoder`` on ONNX Runtime when ``model_dir`` holds an export of these weights and
    ``onnxruntime`` is installed (``int8``: the quantised towers, where exported; ``threads``: each
    session's intra-op threads, None for ONNX Runtime's default; ``spin``: given ``threads``, whether
    its idle threads wait busily, see :func:`_session`); otherwise
    ``encoder`` itself. A file whose sha256 differs from the export's record is not used. Where an
    export is there but cannot be used as asked (other weights, a file changed, no
    onnxruntime), the log says why (a warning) and that tower runs on torch; ``int8`` for a tower
    with no int8 copy: a warning, and it runs on its fp32 export."""
    info = onnx_export_info(model_dir, warn=True)
    if info is None:
        return encoder
    if info.get("space_id") != encoder.space_id:
        log.warning("%s/%s: exported from other weights than the model's now; queries run on torch "
                    "(nobackfill export-onnx %s exports these)", model_dir, EXPORT_DIR, model_dir)
        return encoder
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        log.warning("%s has an ONNX export but onnxruntime is not installed (pip install 'nobackfill[onnx]'); "
                    "queries run on torch", model_dir)
        return encoder
    sessions, files = {}, {}
    for tower, entry in info["towers"].items():
        if tower not in encoder.modalities:
            continue
        if not isinstance(entry, dict):
            log.warning("%s/%s/export.json: its %s tower's record is %r; that tower runs on torch", model_dir,
                        EXPORT_DIR, tower, entry)
            continue
        if int8 and "int8" not in entry:
            log.warning("%s: the %s tower has no int8 export (nobackfill export-onnx --int8); it runs in fp32",
                        model_dir, tower)
        entry = entry.get("int8", entry) if int8 else entry
        path = Path(model_dir) / EXPORT_DIR / str(entry.get("file", ""))
        if not path.is_file() or _sha256(path) != entry.get("sha256"):
            log.warning("%s: missing or changed since its export (sha256); the %s tower runs on torch", path, tower)
            continue
        try:
            sessions[tower] = _session(path, threads, spin)
        except Exception as e:  # a file ONNX Runtime cannot load (another version's, damaged): torch answers
            log.warning("%s: ONNX Runtime cannot load it (%s: %s); the %s tower runs on torch (nobackfill "
                        "export-onnx %s exports it again)", path, type(e).__name__, str(e).strip()[:200], tower,
                        model_dir)
            continue
        files[tower] = str(path)
    if not sessions:
        return encoder
    log.info("%s: queries on ONNX Runtime (%s)", model_dir, ", ".join(f"{t}: {Path(f).name}" for t, f in files.items()))
    return OnnxEncoder(encoder, sessions, files)
