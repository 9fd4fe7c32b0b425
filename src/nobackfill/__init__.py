"""nobackfill: cross-modal retrieval whose embedding model keeps improving without re-embedding the
gallery. Start with :class:`Client` (in process or over HTTP).

May import: ``client``.
"""

from .client import Client, ClientError

__all__ = ["Client", "ClientError"]
