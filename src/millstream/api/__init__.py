"""The REST API: a FastAPI app over the metadata store (docs/rest-api.md).

Build it with :func:`millstream.api.app.create_app`; routes live in :mod:`millstream.api.routes`,
one module per resource.
"""

from millstream.api.app import create_app

__all__ = ["create_app"]
