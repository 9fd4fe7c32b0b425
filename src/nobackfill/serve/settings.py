"""What ``nobackfill serve`` is configured with: the collection, the API keys and their roles, the
directories requests may name, and the limits on what a request may carry."""

from __future__ import annotations

import hmac
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..search.limits import Limits

__all__ = ["KeyRing", "Limits", "ServeSettings", "ROLES"]

#: read: search, get, status, thumbnails; admin: everything read may, plus writes and control
ROLES = ("read", "admin")


class KeyRing:
    """API keys by role, from a TOML file ``read = ["..."]``, ``admin = ["..."]``. Keys are
    compared in constant time (``hmac.compare_digest``) and never printed."""

    def __init__(self, keys: dict[str, list[str]]) -> None:
        self._keys = [(k.encode("utf-8"), role) for role in ROLES for k in keys.get(role, [])]
        if not self._keys:
            raise ValueError("no API keys: the keys file needs read = [...] and/or admin = [...]")

    @classmethod
    def load(cls, path: str | Path) -> "KeyRing":
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{p}: keys file not found") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{p}: not valid TOML ({e})") from None
        unknown = set(data) - set(ROLES)
        if unknown:
            raise ValueError(f"{p}: unknown role(s) {sorted(unknown)}; roles: {', '.join(ROLES)}")
        for role in ROLES:
            keys = data.get(role, [])
            if not isinstance(keys, list) or not all(isinstance(k, str) and len(k) >= 8 for k in keys):
                raise ValueError(f"{p}: {role} must be a list of keys of at least 8 characters")
        return cls({r: list(data.get(r, [])) for r in ROLES})

    def role_of(self, key: str | None) -> str | None:
        """The role of ``key`` (admin if several), or None. Every stored key is compared, so the
        time taken does not depend on which one (if any) matched."""
        if not key:
            return None
        given = key.encode("utf-8")
        found = None
        for stored, role in self._keys:
            if hmac.compare_digest(given, stored) and (found is None or role == "admin"):
                found = role
        return found


@dataclass
class ServeSettings:
    """``models_root``: the model directories ``POST /v1/upgrade`` may name (``model``) lie under it;
    ``upgrades_root``: the upgrade directories (bridges) it may name (``bridges``); ``data_root``: the
    calibration data (``calibrate``). A root left None refuses such paths (403). Responses show paths
    relative to these roots or to the collection, never the server's file system."""

    collection: str
    keys: KeyRing
    models_root: Path | None = None
    upgrades_root: Path | None = None
    data_root: Path | None = None  # calibration data a request may name must lie under it
    uploads: Path | None = None  # where uploaded images are kept (default: <collection>/uploads)
    limits: Limits = field(default_factory=Limits)
    backfill_workers: int = 1
    ray_address: str | None = None  # the Ray cluster of engine 'ray' backfills (auto: this machine's); None: refused
    warm: bool = True
    query_cache: int = 4096  # text query embeddings kept (LRU; 0: none)
    query_threads: int = 1  # intra-op threads for query encoding: torch (the search batcher's thread), ONNX Runtime sessions
    onnx: str | None = None  # query encoders on ONNX Runtime: auto / export / int8 / off (None: NOBACKFILL_ONNX)
