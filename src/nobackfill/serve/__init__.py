"""``nobackfill serve``: an HTTP API (FastAPI) and a web page over one live-upgrading collection.

May import: ``catalog``, ``client``, ``collection``, ``data``, ``encoders``, ``gallery``, ``lifecycle``, ``search``.
"""

from .app import ApiError, create_app
from .settings import KeyRing, Limits, ServeSettings

__all__ = ["ApiError", "KeyRing", "Limits", "ServeSettings", "create_app"]
