"""The cloud service: one FastAPI app (REST API, web page, /metrics, /healthz) that also runs the ZeroMQ ingest
and the filter publisher.

`start_services(config, stack)` opens the database, starts the ingest, the publisher, the notifier and the
retention sweeps (and the stack stops them in reverse order); a configuration the host cannot honour (a data_dir
that cannot be created, a database that cannot be opened, missing keys) is one FilterForwardError line, before
the HTTP server starts. `create_app(config, services)` describes the app over those parts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from http import HTTPStatus
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Request, params, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy import text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import sessionmaker
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, compile_path

from cloud import retention
from cloud.config import CloudConfig
from cloud.dataset_folders import DatasetFolders
from cloud.datasets import Datasets
from cloud.db import make_engine, session_factory
from cloud.framestore import FrameStore
from cloud.ingest import Ingest
from cloud.media_responses import get_and_head
from cloud.metrics import ServiceCollector
from cloud.notify import Notifier
from cloud.publisher import Publisher
from cloud.registry import Registry, RegistryError
from cloud.routers import datasets, edges, events, feedback, filters, no_nul_bytes, stats, training
from cloud.schemas import Health, errors
from cloud.storage import Storage
from cloud.training import renew_leases
from models.errors import FilterForwardError, validation_summary

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).parent / "web"
STOP_WAIT = 30.0  # seconds a shutdown waits for a retention sweep in progress
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")  # what a 405's Allow can name


@dataclass(frozen=True)
class Services:
    """The running service's parts, shared by the request handlers through `app.state.services`."""

    engine: Engine
    sessions: sessionmaker
    store: FrameStore
    storage: Storage
    registry: Registry
    datasets: Datasets
    notifier: Notifier
    ingest: Ingest
    publisher: Publisher
    metrics: CollectorRegistry


def create_app(config: CloudConfig, services: Services) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        log.info("cloud service stopping")

    app = FastAPI(
        title="FilterForward cloud",
        description="Filter registry, edges, events and their frames. Send 'Authorization: Bearer <token>'.",
        version="1",
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.services = services
    for module in (filters, edges, events, stats, datasets, training, feedback):
        app.include_router(module.router, prefix="/api", dependencies=[Depends(no_nul_bytes)])
    app.add_exception_handler(RegistryError, _registry_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(status.HTTP_404_NOT_FOUND, _not_found)
    app.add_exception_handler(status.HTTP_405_METHOD_NOT_ALLOWED, _method_not_allowed)
    get_and_head(app, "/healthz", tags=["service"], responses=errors(503))(healthz)
    app.add_api_route("/metrics", metrics, methods=["GET"], tags=["service"], response_class=Response)
    app.add_api_route("/", index, methods=["GET"], include_in_schema=False)
    app.mount("/static", StaticFiles(directory=WEB_DIR, check_dir=False), name="static")
    return app


def start_services(config: CloudConfig, stack: ExitStack) -> Services:
    """Open and start every part; `stack` closes them in reverse order (also when a later part fails)."""
    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FilterForwardError(
            f"cannot create data_dir {config.data_dir} ({exc.strerror}): pick a folder this user can write"
        ) from None
    engine = _open_database(config.db_url)
    stack.callback(engine.dispose)
    sessions = session_factory(engine)
    store = FrameStore(config.data_dir / "frames")
    retention.clean_orphans(store, older_than=0)  # nothing writes yet: every temporary file is an orphan
    datasets = Datasets(sessions, DatasetFolders(config.data_dir / "datasets"))
    storage = Storage(sessions, store, datasets)
    notifier = Notifier(config, config.base_url)
    stack.callback(notifier.close)  # after the ingest stops: flushes what it queued
    sweep_now = threading.Event()  # the ingest sets it on a full disk: retention runs early
    ingest = Ingest(config, storage, sessions, notify=notifier.publish, on_disk_full=sweep_now.set, datasets=datasets)
    ingest.start()
    stack.callback(ingest.stop)
    filters_changed = threading.Event()  # the registry sets it after each committed change: the publisher sends it
    publisher = Publisher(config.zmq, sessions, wake=filters_changed)
    publisher.start(ingest.context)  # in the ingest's context: the same ZAP allow-list judges edges on both sockets
    stack.callback(publisher.stop)  # before the ingest stops: its context waits for the publisher's socket
    log.info("ingest on %s:%d, filter updates on %s:%d", config.zmq.bind, ingest.port, config.zmq.bind, publisher.port)
    _start_retention(config, sessions, store, stack, sweep_now)
    metrics_registry = CollectorRegistry(auto_describe=False)
    # "published" stays among the ingest's counts: the metric filterforward_ingest_total{count="published"} is kept
    counts = {"ingest": lambda: {**ingest.counts, **publisher.counts}, "notify": lambda: notifier.counts}
    metrics_registry.register(ServiceCollector(sessions, config, counts, ingest.last_heard))
    registry = Registry(sessions, config.max_upload_bytes, on_change=filters_changed.set)
    renew_leases(sessions, timedelta(seconds=config.training.lease))
    return Services(engine, sessions, store, storage, registry, datasets, notifier, ingest, publisher, metrics_registry)


def _open_database(url: str) -> Engine:
    try:
        return make_engine(url)
    except (SQLAlchemyError, OSError) as exc:
        try:
            shown = make_url(url).render_as_string(hide_password=True)
        except ArgumentError:
            shown = "(unparsable)"
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise FilterForwardError(
            f"cannot open the database {shown} ({reason}): check database_url and that the database server is up"
        ) from None


def _start_retention(
    config: CloudConfig, sessions: sessionmaker, store: FrameStore, stack: ExitStack, wake: threading.Event
) -> None:
    """Sweep now, every `retention.interval` seconds and whenever `wake` is set, in a thread until the stack
    closes."""
    policy = config.retention
    stop = threading.Event()

    def loop() -> None:
        while True:
            try:
                retention.sweep(sessions, store, policy.max_age_days, policy.max_bytes)
            except Exception:  # a failed sweep (e.g. the DB briefly away) must not end the sweeps
                log.exception("retention sweep failed; next try in %.0f s", policy.interval)
            wake.wait(policy.interval)
            wake.clear()
            if stop.is_set():
                return

    thread = threading.Thread(target=loop, name="retention", daemon=True)
    thread.start()
    stack.callback(thread.join, STOP_WAIT)
    stack.callback(wake.set)
    stack.callback(stop.set)


def healthz(request: Request) -> Health:
    """Open: 200 while the database answers and the ingest runs, 503 otherwise."""
    if not request.app.state.services.ingest.alive:
        log.error("health check: the ZeroMQ ingest has stopped")
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the ingest has stopped: see the service log")
    try:
        with request.app.state.services.sessions() as session:
            session.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        log.warning("health check: database unreachable: %s", exc)
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "database unreachable: see the service log") from None
    return Health(status="ok")


def metrics(request: Request) -> Response:
    """Open: Prometheus text exposition of the service's counts."""
    return Response(generate_latest(request.app.state.services.metrics), media_type=CONTENT_TYPE_LATEST)


def index() -> Response:
    page = WEB_DIR / "index.html"
    if not page.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, "the web page is not installed (cloud/web/index.html)")
    return FileResponse(page)


async def _registry_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RegistryError)
    return JSONResponse({"detail": str(exc)}, exc.status)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    """A path no route has gets a detail that says where the paths are; the endpoints' own 404s keep theirs."""
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail
    if detail == HTTPStatus.NOT_FOUND.phrase:  # Starlette's own: no route for the path
        detail = f"no such path {request.url.path}: the API's paths are listed at /docs"
    return JSONResponse({"detail": detail}, status.HTTP_404_NOT_FOUND, headers=exc.headers)


async def _method_not_allowed(request: Request, _exc: Exception) -> JSONResponse:
    """405 with every method of the path in Allow (Starlette names only the first route's, and each method here is a
    route of its own): those the API documents for it, else those the router would take."""
    path = request.scope["path"]
    allowed = _documented_methods(request.app, path) or _routed_methods(request.app, path)
    detail = f"{request.method} is not allowed on {request.url.path}: use {', '.join(allowed)}"
    return JSONResponse({"detail": detail}, status.HTTP_405_METHOD_NOT_ALLOWED, headers={"Allow": ", ".join(allowed)})


def _documented_methods(app: FastAPI, path: str) -> list[str]:
    """The methods of the OpenAPI path the request path fits; a literal path (/api/datasets/footage) before a
    parametrised one it also fits (/api/datasets/{name}), as the router takes them."""
    fits = []
    for template, operations in app.openapi()["paths"].items():
        regex, _, parameters = compile_path(template)
        if regex.match(path):
            fits.append((len(parameters), [method for method in HTTP_METHODS if method.lower() in operations]))
    return min(fits)[1] if fits else []


def _routed_methods(app: FastAPI, path: str) -> list[str]:
    """The methods the app's router would take for an undocumented path (it nests included routers, so asking it is
    the way to know)."""
    scope = {"type": "http", "path": path, "root_path": ""}
    return [
        method
        for method in HTTP_METHODS
        if any(route.matches({**scope, "method": method})[0] == Match.FULL for route in app.router.routes)
    ]


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's list of validation errors as the API's one-line detail."""
    assert isinstance(exc, RequestValidationError)
    detail = _body_mixup(request, exc) or _form_part_mixup(exc) or validation_summary(exc)
    return JSONResponse({"detail": detail}, status.HTTP_422_UNPROCESSABLE_CONTENT)


def _body_mixup(request: Request, exc: RequestValidationError) -> str | None:
    """A body that is not what the endpoint reads, said so ("body.1: JSON decode error" and "body.spec: Field
    required" did not): broken JSON, or JSON sent where a multipart form is expected."""
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        reason = first.get("ctx", {}).get("error", "")
        return f"the body is not valid JSON ({reason}): send one JSON object with Content-Type: application/json"
    sent_json = request.headers.get("content-type", "").startswith("application/json")
    route = request.scope.get("route")
    if sent_json and first["type"] == "missing" and isinstance(route, APIRoute) and _takes_a_form(route):
        return f"{'.'.join(map(str, first['loc']))}: missing: this endpoint takes a multipart form (curl -F), not JSON"
    return None


def _takes_a_form(route: APIRoute) -> bool:
    """Whether the route reads its body as a form (FastAPI Form and File parameters; File is a Form)."""
    return any(isinstance(field.field_info, params.Form) for field in route.dependant.body_params)


def _form_part_mixup(exc: RequestValidationError) -> str | None:
    """A form field sent as the other kind of part: curl's -F 'x=@FILE' uploads a file and -F 'x=<FILE' sends its
    text, easily swapped; pydantic's own words for it ("Input should be a valid string") do not say so."""
    first = exc.errors()[0]
    if len(first["loc"]) != 2 or first["loc"][0] != "body":
        return None
    field = first["loc"][1]
    if first["type"] == "string_type" and isinstance(first["input"], UploadFile):
        return f"body.{field}: sent as a file, but it is a text field: send the file's text (curl -F '{field}=<FILE')"
    if isinstance(first["input"], str) and "Expected UploadFile" in first["msg"]:
        return f"body.{field}: sent as text, but it is a file: upload the file (curl -F '{field}=@FILE')"
    return None
