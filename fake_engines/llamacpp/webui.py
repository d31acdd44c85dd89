"""The web UI routes as llama-server serves them (tools/server/server-http.cpp): `/` and `/index.html`
(revalidated, cross-origin isolated, ETag / 304), the PWA files at `no-cache`, all of them public
(no API key, answered while the model loads). With --no-ui they are gone (404) except `/sw.js`,
which answers with a worker that unregisters itself, so a browser that cached the UI drops it.

The look-alike's page is a short one of its own, not llama.cpp's Svelte UI; llama-server's gzip-only
builds (415 without `Accept-Encoding: gzip`) are not imitated: every asset is sent as it is.
"""

from __future__ import annotations

import hashlib
import json

from aiohttp import web

from fake_engines.llamacpp.config import BUILD_INFO

INDEX_HTML = f"""<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>llama.cpp</title>
<link rel="manifest" href="manifest.webmanifest"></head>
<body><p>fake-llama-server ({BUILD_INFO}): a look-alike of llama.cpp's llama-server without its web UI.
The API is served at /v1/chat/completions, /completion, /props and the other llama-server routes.</p></body>
</html>
"""

SW_JS = "self.addEventListener('fetch', () => {});\n"
"""The UI's service worker: it caches nothing here."""

SW_REMOVE_JS = """
self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil((async () => {
    await self.registration.unregister();
    for (const key of await caches.keys()) await caches.delete(key);
    for (const c of await self.clients.matchAll({ type: 'window' })) c.navigate(c.url);
})()));
"""
"""What llama-server answers /sw.js with when the UI is off: a worker that removes itself."""

ASSETS: dict[str, tuple[str, str]] = {
    "index.html": ("text/html", INDEX_HTML),
    "sw.js": ("application/javascript", SW_JS),
    "manifest.webmanifest": ("application/manifest+json",
                             json.dumps({"name": "llama.cpp", "short_name": "llama.cpp", "start_url": "./",
                                         "display": "standalone"})),
    "_app/version.json": ("application/json", json.dumps({"version": BUILD_INFO})),
}
"""The embedded assets by name: content type and body."""

UI_PATHS = frozenset({"/", *(f"/{name}" for name in ASSETS)})
"""llama-server's frontend paths: public, and served while the model loads."""


def _etag(body: str) -> str:
    return '"' + hashlib.sha256(body.encode()).hexdigest()[:16] + '"'


async def index(request: web.Request) -> web.Response:
    """`/` and `/index.html`: ETag with 304 on If-None-Match, isolation headers, revalidated."""
    content_type, body = ASSETS["index.html"]
    etag = _etag(body)
    match = request.headers.get("If-None-Match", "")
    if match and match in (etag, "W/" + etag):
        return web.Response(status=304, headers={"ETag": etag})
    return web.Response(text=body, content_type=content_type,
                        headers={"ETag": etag, "Cross-Origin-Embedder-Policy": "require-corp",
                                 "Cross-Origin-Opener-Policy": "same-origin", "Cache-Control": "no-cache"})


def _asset(name: str):
    content_type, body = ASSETS[name]

    async def serve(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type=content_type, headers={"Cache-Control": "no-cache"})
    return serve


async def _sw_remove(request: web.Request) -> web.Response:
    return web.Response(text=SW_REMOVE_JS, content_type="application/javascript",
                        headers={"Cache-Control": "no-cache"})


def add_ui_routes(app: web.Application, enabled: bool) -> None:
    """The UI's routes; with the UI off only the self-removing /sw.js."""
    if not enabled:
        app.router.add_get("/sw.js", _sw_remove)
        return
    app.router.add_get("/", index)
    app.router.add_get("/index.html", index)
    for name in ASSETS:
        if name != "index.html":
            app.router.add_get("/" + name, _asset(name))
