"""The web console: static HTML, CSS and JavaScript under ``api/ui`` (package data, nothing
fetched from the internet), served at ``/ui``. The page reads and drives the REST API from the
browser; the server adds no endpoint of its own for it."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

#: The console's files (shipped in the wheel with the package).
UI_DIR = Path(__file__).resolve().parent / "ui"
#: Where the console is served.
UI_PATH = "/ui"


def console_url(api_url: str) -> str:
    """The console's address under the REST API at ``api_url``."""
    return api_url.rstrip("/") + UI_PATH


def install_console(app: FastAPI) -> None:
    """Serve the console at ``/ui/`` (``/ui`` redirects there) and redirect ``/`` to it when
    no route answers ``/``."""
    if not (UI_DIR / "index.html").is_file():
        raise FileNotFoundError(f"the web console's files are missing from {UI_DIR}")

    async def to_console() -> RedirectResponse:
        return RedirectResponse(UI_PATH + "/", status_code=307)

    app.add_api_route(UI_PATH, to_console, methods=["GET"], include_in_schema=False)
    if not any(getattr(route, "path", None) == "/" for route in app.routes):
        app.add_api_route("/", to_console, methods=["GET"], include_in_schema=False)
    app.mount(UI_PATH, StaticFiles(directory=UI_DIR, html=True), name="console")
