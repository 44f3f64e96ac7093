"""Filters against the base models of the edges they target: an MC's scores mean nothing on another base model's
features, so an edge's MC bank refuses such a filter, and the registry refuses to store one. The bank refuses a
filter trained at another input size as well; GET /api/edges lists both kinds as the edge's refused filters.

A filter targets an edge when it names one of the edge's cameras, or all cameras ('*'). Only filters that record
their base model and edges that have reported theirs (on hello) are compared: the others cannot disagree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from cloud.db import Camera, Edge, Filter
from cloud.publisher import stored_spec
from models.filterspec import BaseModelId, FilterSpec


@dataclass(frozen=True)
class Mismatch:
    """A filter and an edge it targets that runs another base model than the filter was trained on."""

    filter: str
    filter_model: BaseModelId
    edge: str
    edge_model: BaseModelId


def stored_specs(session: Session) -> list[FilterSpec]:
    """The specs of every registered filter (an invalid stored one is logged and left out)."""
    rows = session.scalars(select(Filter).options(defer(Filter.onnx)).order_by(Filter.name))
    return [spec for row in rows if (spec := stored_spec(row)) is not None]


def mismatches(session: Session, specs: Iterable[FilterSpec], edge: str | None = None) -> list[Mismatch]:
    """Each (filter among `specs`, edge it targets) that disagree on the base model; only `edge` when given."""
    reported, cameras = _reported(session, Edge.base_model, edge)
    models = {edge_id: BaseModelId.model_validate(raw) for edge_id, raw in reported.items()}
    return [
        Mismatch(spec.name, spec.base_model, edge_id, model)
        for spec in specs
        if spec.base_model is not None
        for edge_id, model in models.items()
        if model != spec.base_model and targets(spec, cameras[edge_id])
    ]


def size_mismatches(session: Session, specs: Iterable[FilterSpec], edge: str | None = None) -> list[tuple[str, str]]:
    """Each (filter among `specs`, edge it targets) trained at another input size than the edge's base DNN runs
    at (its MC bank refuses those too; the registry stores them, as edges of a fleet may run different sizes)."""
    sizes, cameras = _reported(session, Edge.input_size, edge)
    return [
        (spec.name, edge_id)
        for spec in specs
        for edge_id, size in sizes.items()
        if tuple(size) != tuple(spec.input_size) and targets(spec, cameras[edge_id])
    ]


def refusals(session: Session, specs: Iterable[FilterSpec], edge: str | None = None) -> list[tuple[str, str]]:
    """Each (filter among `specs`, edge it targets) whose MC bank refuses it, sorted: trained on another base model
    or at another input size than the edge runs; only `edge` when given."""
    specs = list(specs)
    found = {(m.filter, m.edge) for m in mismatches(session, specs, edge)} | set(size_mismatches(session, specs, edge))
    return sorted(found)


def _reported(session: Session, column: Any, edge: str | None) -> tuple[dict[str, Any], dict[str, set[str]]]:
    """Edge id -> its `column` for the edges that reported it (only `edge` when given), and their cameras."""
    query = select(Edge.id, column).order_by(Edge.id)
    if edge is not None:
        query = query.where(Edge.id == edge)
    reported = {edge_id: value for edge_id, value in session.execute(query) if value}
    cameras: dict[str, set[str]] = defaultdict(set)
    for edge_id, name in session.execute(select(Camera.edge_id, Camera.name).where(Camera.edge_id.in_(reported))):
        cameras[edge_id].add(name)
    return reported, cameras


def targets(spec: FilterSpec, cameras: set[str]) -> bool:
    """Whether a filter runs on an edge with these cameras."""
    return "*" in spec.cameras or not cameras.isdisjoint(spec.cameras)
