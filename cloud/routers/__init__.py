"""The REST API's routers, one module per resource, and the dependencies they share.

The running service's parts (cloud.app.Services) live on `app.state.services`, created by the app's lifespan.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Response, status
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session
from starlette.types import Message

from cloud.config import CloudConfig
from cloud.datasets import Datasets
from cloud.framestore import FrameStore
from cloud.liveness import LastHeard
from cloud.registry import Registry


def get_config(request: Request) -> CloudConfig:
    return request.app.state.config


def get_session(request: Request) -> Iterator[Session]:
    """A read session per request (writes go through the registry, which runs its own transactions)."""
    with request.app.state.services.sessions() as session:
        yield session


def get_registry(request: Request) -> Registry:
    return request.app.state.services.registry


def get_datasets(request: Request) -> Datasets:
    return request.app.state.services.datasets


def get_store(request: Request) -> FrameStore:
    return request.app.state.services.store


def get_last_heard(request: Request) -> LastHeard:
    return request.app.state.services.ingest.last_heard


ConfigDep = Annotated[CloudConfig, Depends(get_config)]
SessionDep = Annotated[Session, Depends(get_session)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
StoreDep = Annotated[FrameStore, Depends(get_store)]
DatasetsDep = Annotated[Datasets, Depends(get_datasets)]
LastHeardDep = Annotated[LastHeard, Depends(get_last_heard)]


async def each_part_once(request: Request) -> None:
    """Refuses a multipart form that repeats a field: FastAPI would quietly keep one of the copies (which model
    was meant?). The form is the one FastAPI already parsed for the endpoint (Starlette keeps it)."""
    counts = Counter(key for key, _ in (await request.form()).multi_items())
    repeated = sorted(key for key, count in counts.items() if count > 1)
    if repeated:
        sent = ", ".join(f"'{key}' {counts[key]} times" for key in repeated)
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"the form sent {sent}: send each field once")


EachPartOnce = Depends(each_part_once)


# A JSON string's NUL character: \u0000 after an even number of backslashes (\\u0000 is a backslash and "u0000").
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


async def no_nul_bytes(request: Request) -> None:
    """Refuses a NUL byte (%00) in a path or query parameter, or a NUL character (\\u0000) in a JSON body: PostgreSQL's
    text holds none, so the driver raised and the API answered 500 (SQLite took them). Every /api route depends on
    it (cloud.app)."""
    for where, params in (("path", request.path_params.items()), ("query", request.query_params.multi_items())):
        for key, value in params:
            if isinstance(value, str) and "\x00" in value:
                raise HTTPException(
                    status.HTTP_422_UNPROCESSABLE_CONTENT,
                    f"{where} parameter {key!r} holds a NUL byte (%00): no name or value here can contain one",
                )
    if request.headers.get("content-type", "").startswith("application/json") and _JSON_NUL.search(
        await request.body()
    ):
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, "the JSON body holds a NUL character (\\u0000): send text without it"
        )


# Room for the other fields and the multipart framing around an uploaded file in a form's body.
FORM_OVERHEAD = 256 * 1024


def body_limit_route(limit: Callable[[Request], int], too_big: Callable[[int, Request], str]) -> type[APIRoute]:
    """A route class that refuses (413, `too_big(size, request)`) a body over `limit(request)` bytes from its
    Content-Length, or as soon as it streams past it: an oversized upload is never read (or spooled to disk) whole."""

    class BodyLimitRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
            handler = super().get_route_handler()

            async def limited(request: Request) -> Response:
                most = limit(request)
                declared = request.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > most:
                    raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, too_big(int(declared), request))
                received = 0

                async def capped() -> Message:
                    nonlocal received
                    message = await request.receive()
                    received += len(message.get("body", b""))
                    if received > most:
                        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, too_big(received, request))
                    return message

                return await handler(Request(request.scope, capped))

            return limited

    return BodyLimitRoute


def not_found(message: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, message)
