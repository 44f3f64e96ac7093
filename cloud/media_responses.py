"""What players, caches and link checkers expect of the API's images and clips: HEAD beside GET, and byte ranges
(a browser seeks in an MP4 by asking for ranges; Safari plays no video whose server ignores them)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request, Response, status

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])
ONE_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def get_and_head(router: Any, path: str, **options: Any) -> Callable[[Endpoint], Endpoint]:
    """Register the endpoint for GET and HEAD on `path` (on an APIRouter or the app), one route each: a route with
    both methods gave both the same OpenAPI operationId, which breaks client generators."""

    def register(endpoint: Endpoint) -> Endpoint:
        for method in ("GET", "HEAD"):
            operation_id = f"{endpoint.__name__}_{method.lower()}"
            router.add_api_route(path, endpoint, methods=[method], operation_id=operation_id, **options)
        return endpoint

    return register


def media(media_type: str, description: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route that answers with a file of this type."""
    return {200: {"content": {media_type: {}}, "description": description}}


def ranged(request: Request, body: bytes, media_type: str, headers: dict[str, str] | None = None) -> Response:
    """The body, or the one byte range the request's Range header asks for: 206 with its Content-Range, 416 for a
    range that starts past the end. A header of another form (several ranges, other units) gets the whole body, as
    RFC 9110 allows."""
    headers = {**(headers or {}), "Accept-Ranges": "bytes"}
    wanted = ONE_RANGE.fullmatch(request.headers.get("range", "").strip())
    span = _span(wanted, len(body)) if wanted else None
    if span is None:
        return Response(body, media_type=media_type, headers=headers)
    start, end = span
    if start >= len(body):
        headers["Content-Range"] = f"bytes */{len(body)}"
        return Response(status_code=status.HTTP_416_RANGE_NOT_SATISFIABLE, headers=headers)
    headers["Content-Range"] = f"bytes {start}-{end}/{len(body)}"
    return Response(body[start : end + 1], status.HTTP_206_PARTIAL_CONTENT, headers, media_type)


def _span(wanted: re.Match[str], size: int) -> tuple[int, int] | None:
    """(first, last) byte of `bytes=first-last`, `bytes=first-` or `bytes=-suffix`; None for a malformed range, which
    is ignored. A first byte past the end stays past it (416); an empty suffix is one too."""
    first, last = wanted.groups()
    if not first and not last:
        return None
    if not first:  # the last `last` bytes
        return (max(0, size - int(last)), size - 1) if int(last) else (size, size)
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if last and int(last) < start:
        return None
    return start, end
