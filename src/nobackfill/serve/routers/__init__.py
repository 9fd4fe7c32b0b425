"""The service's operations, one :class:`fastapi.APIRouter` per area, included by
:func:`~nobackfill.serve.app.create_app` in this order (the order of the OpenAPI document).

May import: ``lifecycle``, ``search``.
"""

from . import control, health, items, search

__all__ = ["ROUTERS", "control", "health", "items", "search"]

#: every router of the app, in the order it is included
ROUTERS = (search.router, items.router, control.router, health.router)
