"""The filter registry: create, update and delete filters, each change logged as a FilterChange for the edges.

Every change writes the Filter row and a FilterChange with version = max + 1 in one transaction, so the
publisher (cloud.publisher) sends changes in exactly the order they were made; `on_change` wakes it once the
transaction is committed. Two writers that pick the same version collide on the change log's primary key; the
loser retries with the next one. Every refusal (RegistryError) happens before anything is written.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TypeVar

from pydantic import ValidationError
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, defer, sessionmaker

from cloud.base_models import mismatches
from cloud.db import Edge, Filter, FilterChange, begin_writing, utcnow
from common.protocol import check_filter_fits
from models.bundle import check_mc_model
from models.errors import FilterForwardError, is_disk_full, validation_summary
from models.filterspec import MAX_VERSION, FilterSpec
from models.roi import INPUT
from models.taps import EFFICIENTNET_LITE0_TAPS, PIXEL_TAP, PIXELS, Tap, check_input_size

log = logging.getLogger(__name__)

RETRIES = 5
NAME_CHARS = 64  # a filter name's longest (models.filterspec.NAME_PATTERN)
TAPS: dict[str, Tap] = {**EFFICIENTNET_LITE0_TAPS, PIXELS: PIXEL_TAP}
T = TypeVar("T")


class RegistryError(FilterForwardError):
    """A refused request; `status` is the HTTP status the API answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_spec(text: str) -> FilterSpec:
    """A FilterSpec from the JSON text of an upload form, validated strictly (400 not JSON, 422 invalid)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RegistryError(400, f"spec is not valid JSON ({exc}): send the filter spec as a JSON object") from None
    if not isinstance(raw, dict):
        raise RegistryError(400, f"spec is a JSON {type(raw).__name__}: send the filter spec as a JSON object")
    try:
        spec = FilterSpec.model_validate(raw, context=INPUT)
    except ValidationError as exc:
        raise RegistryError(422, f"invalid filter spec: {validation_summary(exc, 'spec')}") from None
    if spec.tap not in TAPS:
        raise RegistryError(422, f"invalid filter spec: tap '{spec.tap}' is unknown; use one of {sorted(TAPS)}")
    try:
        check_input_size(spec.input_size)
        check_filter_fits(spec)
    except ValueError as exc:  # ProtocolError is one
        raise RegistryError(422, f"invalid filter spec: {exc}") from None
    return spec


class Registry:
    def __init__(self, sessions: sessionmaker, max_upload_bytes: int, on_change: Callable[[], None]) -> None:
        self._sessions = sessions
        self.max_upload_bytes = max_upload_bytes
        self._on_change = on_change  # called after each committed change (wakes the publisher)

    def filters(self) -> list[tuple[Filter, int]]:
        """Every filter by name with its model's size; the models themselves are not loaded (a list of a hundred
        filters read up to 160 MB of them)."""
        query = select(Filter, func.length(Filter.onnx)).options(defer(Filter.onnx)).order_by(Filter.name)
        with self._sessions() as session:
            return [(row, int(size)) for row, size in session.execute(query)]

    def get(self, name: str) -> Filter:
        with self._sessions() as session:
            return _existing(session, name)

    def create(self, spec: FilterSpec, onnx: bytes) -> Filter:
        self._check_model(spec, onnx)

        def insert(session: Session, version: int) -> Filter:
            if session.get(Filter, spec.name) is not None:
                raise RegistryError(
                    409, f"filter '{spec.name}' already exists: update it with PUT /api/filters/{spec.name}"
                )
            _check_base_model(session, spec)
            now = utcnow()
            row = Filter(
                name=spec.name,
                spec=spec.model_dump(mode="json"),
                onnx=onnx,
                revision=version,
                created_at=now,
                updated_at=now,
            )
            session.add(row)
            return row

        row = self._change(spec.name, "put", insert)
        log.info("filter %s created (revision %d, %d bytes of ONNX)", row.name, row.revision, len(onnx))
        return row

    def update(self, name: str, spec: FilterSpec, onnx: bytes | None) -> Filter:
        """Replace a filter's spec (its version becomes the stored one + 1) and, if given, its model."""
        if onnx is not None:  # outside the transaction, which holds every other filter change back
            self._check_model(spec, onnx)

        def replace(session: Session, version: int) -> Filter:
            row = _existing(session, name)  # a missing filter is 404 whatever name its spec gives
            if spec.name != name:
                raise RegistryError(
                    422,
                    f"spec name '{spec.name}' differs from the filter '{name}' in the URL: filters cannot be renamed",
                )
            if onnx is None:  # the stored model must still fit the new spec (tap, ROI, input size)
                self._check_model(spec, row.onnx)
                _check_same_polygon(FilterSpec.model_validate(row.spec), spec)
            stored = int(row.spec.get("version", 1))
            if stored >= MAX_VERSION:
                raise RegistryError(
                    409, f"filter '{name}' is at the highest version ({MAX_VERSION}): delete it and create it again"
                )
            bumped = spec.model_copy(update={"version": stored + 1})
            _check_base_model(session, bumped)
            row.spec = bumped.model_dump(mode="json")
            row.onnx = onnx if onnx is not None else row.onnx
            row.revision = version
            return row

        row = self._change(name, "put", replace)
        log.info("filter %s updated to version %d (revision %d)", name, row.spec["version"], row.revision)
        return row

    def delete(self, name: str) -> None:
        self._change(name, "delete", lambda session, _version: session.delete(_existing(session, name)))
        log.info("filter %s deleted", name)

    def _check_model(self, spec: FilterSpec, onnx: bytes) -> None:
        if len(onnx) > self.max_upload_bytes:
            raise RegistryError(413, too_big(len(onnx), self.max_upload_bytes))
        try:
            check_mc_model(spec, onnx, TAPS[spec.tap].shape(spec.input_size))
        except FilterForwardError as exc:
            raise RegistryError(422, str(exc)) from None

    def _change(self, name: str, action: str, apply: Callable[[Session, int], T]) -> T:
        """Run `apply` and log the change with the next version, in one transaction (retried on a collision);
        `on_change` once it is committed."""
        for attempt in range(1, RETRIES + 1):
            try:
                with self._sessions.begin() as session:
                    _serialize_changes(session)
                    version = (session.scalar(select(func.max(FilterChange.version))) or 0) + 1
                    result = apply(session, version)
                    session.add(FilterChange(version=version, name=name, action=action))
                self._on_change()
                return result
            except IntegrityError:
                log.info("filter change %s %s collided with another (attempt %d); retrying", action, name, attempt)
            except OperationalError as exc:  # nothing was changed: the transaction rolled back
                if is_disk_full(exc):
                    log.error("filter change %s %s refused: the database's disk is full", action, name)
                    raise RegistryError(
                        507, f"filter '{name}' could not be saved: the database's disk is full; free space there"
                    ) from None
                log.error("filter change %s %s failed: %s", action, name, exc)
                raise RegistryError(
                    503, f"filter '{name}' could not be saved: the database is unavailable; retry"
                ) from None
        raise RegistryError(503, f"filter '{name}' could not be saved: too many concurrent changes; retry")


def _check_base_model(session: Session, spec: FilterSpec) -> None:
    """Refuse a filter that an edge it targets would refuse: one trained on another base model than that edge
    reported. Checked in the change's transaction, so it sees the edges as they are when the filter is stored."""
    found = mismatches(session, [spec])
    if not found:
        return
    first = found[0]
    others = f" (and {len(found) - 1} more edge(s))" if len(found) > 1 else ""
    seen = session.scalar(select(Edge.last_seen).where(Edge.id == first.edge))
    raise RegistryError(
        409,
        f"filter '{spec.name}' was trained on base model {first.filter_model} but edge '{first.edge}' runs "
        f"{first.edge_model} (it said so last at {seen:%Y-%m-%d %H:%M} UTC){others}: retrain it on that base model "
        "(--base-model of filterforward train or trainer serve), run the edge on the one it was trained on "
        "(filterforward models export, the edge's base_model:), or, if the edge is gone, forget it "
        f"(DELETE /api/edges/{first.edge})",
    )


def _serialize_changes(session: Session) -> None:
    """Concurrent changes would all read the same max(version) and collide on its key, and a burst of them could
    use up every retry; they queue instead: on PostgreSQL behind a table lock (readers unaffected), on SQLite behind
    the write lock, taken before the read (a deferred transaction would take it only at its first write)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("LOCK TABLE filter_changes IN EXCLUSIVE MODE"))
    else:
        begin_writing(session)


def too_big(size: int, limit: int) -> str:
    return f"the upload is {size} bytes, over the {limit}-byte limit (max_upload_bytes): upload a smaller MC"


def _existing(session: Session, name: str) -> Filter:
    row = session.get(Filter, name)
    if row is None:
        shown = f"'{name}'"
        if len(name) > NAME_CHARS:  # not echoed whole: a 10 kB name made a 10 kB answer
            shown = f"'{name[:NAME_CHARS]}…' ({len(name)} characters; a name has at most {NAME_CHARS})"
        raise RegistryError(404, f"no filter named {shown}: list the filters with GET /api/filters")
    return row


def _check_same_polygon(stored: FilterSpec, spec: FilterSpec) -> None:
    """A polygon region is built into the model as its mask (models.microclassifiers): a new one without a new
    model would change only the change gate and the veto, not what the filter matches."""
    if stored.roi.polygon != spec.roi.polygon:
        raise RegistryError(
            422,
            f"filter '{spec.name}' was trained for another region polygon, which its model holds as its mask: "
            "retrain the MC for the new polygon and send its model with the spec",
        )
