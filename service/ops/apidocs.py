"""GET /docs: Swagger UI for this server's /openapi.json, its script and style served from the
swagger-ui-py package's static files (Swagger UI 5, which reads OpenAPI 3.1), read once at
start; nothing is fetched from elsewhere at run time (no CDN, no validator badge). On the
operator port when one is set (beside /metrics and /dashboard), else on the HTTP port; off with
--no-docs-page. Links are relative, so the page works behind a proxy's path prefix too.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from ringserve.service.protocols.endpoint import Endpoint, Handler, ok
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router

# The files the page loads, each under /docs/NAME, with its content type.
ASSETS = {
    "swagger-ui.css": b"text/css; charset=utf-8",
    "swagger-ui-bundle.js": b"text/javascript; charset=utf-8",
}
PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>ringserve API</title>
<link rel="stylesheet" href="docs/swagger-ui.css">
<style>body { margin: 0; }</style>
</head>
<body>
<div id="swagger-ui"></div>
<script src="docs/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({
  url: "%s",
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
  tryItOutEnabled: false
});
</script>
</body>
</html>
"""


def static_dir() -> Path | None:
    """swagger-ui-py's static/ folder (found without importing the package, which would import
    its web-framework helpers); None when it is not installed."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "static"
    return folder if all((folder / name).is_file() for name in ASSETS) else None


class Page:
    """What /docs serves: the page, the document it shows, and its assets (read at start)."""

    def __init__(self, folder: Path, api: Callable[[], bytes] | None) -> None:
        self.html = (PAGE % ("openapi.json" if api is None else "docs/openapi.json")).encode()
        self.api = api
        self.assets = {name: (folder / name).read_bytes() for name in ASSETS}


def page(docs: Page) -> Handler:
    def serve(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        conn.respond(ex, 200, docs.html, b"text/html; charset=utf-8", NO_STORE)

    return serve


def api_document(docs: Page) -> Handler:
    document = docs.api
    assert document is not None  # mounted only with a document to show

    def serve(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        conn.respond(ex, 200, document(), extra=NO_STORE)

    return serve


def asset(name: str) -> Callable[[Page], Handler]:
    kind = ASSETS[name]

    def make(docs: Page) -> Handler:
        body = docs.assets[name]

        def serve(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
            conn.respond(ex, 200, body, kind, CACHE)

        return serve

    return make


NO_STORE = [(b"cache-control", b"no-store")]
CACHE = [(b"cache-control", b"max-age=3600")]
DOCUMENT = Endpoint(
    "GET", "/docs/openapi.json", api_document,
    "On the operator port: the HTTP port's document, which /docs there shows", "meta",
    ok("OpenAPI 3.1", "document"),
)  # fmt: skip
ROUTES = [
    Endpoint("GET", "/docs", page, "Swagger UI for this document (off: --no-docs-page)", "meta",
             ok("an HTML page", None, "text/html")),
    DOCUMENT,
    Endpoint("GET", "/docs/swagger-ui.css", asset("swagger-ui.css"), "Swagger UI's style sheet",
             "meta", ok("CSS", None, "text/css")),
    Endpoint("GET", "/docs/swagger-ui-bundle.js", asset("swagger-ui-bundle.js"),
             "Swagger UI's script", "meta", ok("JavaScript", None, "text/javascript")),
]  # fmt: skip


def register(router: Router, api: Callable[[], bytes] | None = None) -> None:
    """Add GET /docs and its assets (read now, into memory: about 1.6 MB). The page shows this
    listener's /openapi.json; on the operator listener, `api` gives the HTTP port's document,
    served as /docs/openapi.json and shown instead (the API is what a reader comes for; its
    requests go to the HTTP port). Raises SystemExit when the package is missing (the page is
    on unless --no-docs-page)."""
    folder = static_dir()
    if folder is None:
        raise SystemExit(
            "ringserve: /docs needs the swagger-ui-py package (pip install swagger-ui-py), "
            "or turn the page off with --no-docs-page"
        )
    router.mount([r for r in ROUTES if api is not None or r is not DOCUMENT], Page(folder, api))
