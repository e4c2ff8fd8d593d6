"""The web console at `/ui/` (docs/console.md): static files only, served by the
gateway that also serves `/v1`.

What holds:
- The console is HTML, CSS and ES modules from `static/` in this package, with
  no build step and nothing fetched from elsewhere at run time.
- It has no data routes of its own: the browser calls the same `/v1` API a
  script calls, with the key the person typed, kept in the tab's
  sessionStorage and sent as `Authorization: Bearer` (never in a URL). The
  files here are public, like /openapi.json; what they show is what the key
  may read.
- Only the files in `static/` are served, by a name that cannot leave the
  directory (letters, digits, `-`, `_`, one extension from `_TYPES`); anything
  else is the API's 404 problem.
- Every answer carries a Content-Security-Policy that allows scripts, styles and
  connections to this origin only (no inline script, no framing), so text from
  the API that reached the page as markup could not run.
- The routes stay out of /openapi.json (they are not the API), and HttpMetrics
  labels them by their templates, `/ui/` and `/ui/{name}`.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from fastapi import APIRouter
from starlette.responses import RedirectResponse, Response

from cronwheel.core.errors import NotFound

STATIC = Path(__file__).parent / "static"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}\.(html|js|css|svg)$")
_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidated on each load, so a gateway upgrade never serves old scripts.
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@cache
def _file(name: str) -> bytes | None:
    path = STATIC / name
    return path.read_bytes() if path.is_file() else None


def _serve(name: str) -> Response:
    m = _NAME.match(name)
    body = _file(name) if m else None
    if body is None:
        raise NotFound("console file")
    return Response(body, media_type=_TYPES[m.group(1)], headers=HEADERS)


@router.get("/ui")
async def console_root():
    return RedirectResponse("/ui/", status_code=308)


@router.get("/ui/")
async def console_index():
    return _serve("index.html")


@router.get("/ui/{name}")
async def console_file(name: str):
    return _serve(name)
