"""/api/edges and /api/cameras: which edges and cameras report in, when they were last heard, their stats."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Depends, HTTPException, Request, status
from sqlalchemy import select
from sqlalchemy.orm import Session

from cloud.auth import require
from cloud.base_models import refusals, stored_specs
from cloud.db import Camera, Edge
from cloud.liveness import LastHeard
from cloud.metrics import online_cutoff
from cloud.routers import ConfigDep, LastHeardDep, SessionDep, not_found
from cloud.schemas import CameraOut, EdgeOut, errors

router = APIRouter(tags=["edges"], dependencies=[Depends(require("read"))], responses=errors(400, 401, 403, 404, 422))


@router.get("/edges")
def list_edges(session: SessionDep, config: ConfigDep, last_heard: LastHeardDep) -> list[EdgeOut]:
    edges = session.scalars(select(Edge).order_by(Edge.id)).all()
    cameras = _camera_names(session)
    refused = _refused_filters(session)
    cutoff = online_cutoff(config)
    return [edge_out(edge, last_heard, cameras.get(edge.id, []), refused.get(edge.id, []), cutoff) for edge in edges]


@router.get("/edges/{edge_id}")
def get_edge(edge_id: str, session: SessionDep, config: ConfigDep, last_heard: LastHeardDep) -> EdgeOut:
    edge = session.get(Edge, edge_id)
    if edge is None:
        raise _no_edge(edge_id)
    cameras = _camera_names(session, edge_id).get(edge_id, [])
    refused = _refused_filters(session, edge_id).get(edge_id, [])
    return edge_out(edge, last_heard, cameras, refused, online_cutoff(config))


@router.delete("/edges/{edge_id}", status_code=204, dependencies=[Depends(require("write"))], responses=errors(409))
def forget_edge(
    edge_id: str, request: Request, session: SessionDep, config: ConfigDep, last_heard: LastHeardDep
) -> None:
    """Forget an edge that is gone for good (decommissioned, renamed): it and its cameras leave the lists, and the
    base model it last reported no longer refuses filters; its events and frames stay. 409 while it is online: its
    next message would bring it back."""
    edge = session.get(Edge, edge_id)
    if edge is None:
        raise _no_edge(edge_id)
    last_seen = last_heard.latest(edge_id, edge.last_seen)
    if last_seen >= online_cutoff(config):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"edge '{edge_id}' is online (last heard {last_seen:%Y-%m-%d %H:%M:%S} UTC): stop it first, or it comes "
            "back with its next message",
        )
    request.app.state.services.storage.forget_edge(edge_id)


def _no_edge(edge_id: str) -> HTTPException:
    return not_found(
        f"no edge '{edge_id}' is known (it never connected, or was forgotten): list the edges with GET /api/edges"
    )


@router.get("/cameras")
def list_cameras(session: SessionDep, config: ConfigDep, last_heard: LastHeardDep) -> list[CameraOut]:
    cutoff = online_cutoff(config)
    rows = session.execute(
        select(Camera, Edge.last_seen).join(Edge, Edge.id == Camera.edge_id).order_by(Camera.edge_id, Camera.name)
    )
    return [
        CameraOut(
            edge=camera.edge_id,
            name=camera.name,
            # The edge's liveness (heartbeats) and the camera's own state from the edge's last stats.
            online=last_heard.latest(camera.edge_id, edge_seen) >= cutoff and bool(camera.stats.get("online", True)),
            last_seen=camera.last_seen,
            stats=camera.stats,
        )
        for camera, edge_seen in rows
    ]


def edge_out(edge: Edge, last_heard: LastHeard, cameras: list[str], refused: list[str], cutoff: datetime) -> EdgeOut:
    """Its last_seen is when it was last heard, stored or in memory (cloud.liveness)."""
    last_seen = last_heard.latest(edge.id, edge.last_seen)
    return EdgeOut(
        id=edge.id,
        online=last_seen >= cutoff,
        last_seen=last_seen,
        run=edge.run,
        filters_version=edge.filters_version,
        stats=edge.stats,
        cameras=cameras,
        base_model=edge.base_model,
        refused_filters=refused,
        shared_id=last_heard.shared(edge.id),
    )


def _camera_names(session: Session, edge_id: str | None = None) -> dict[str, list[str]]:
    query = select(Camera.edge_id, Camera.name).order_by(Camera.edge_id, Camera.name)
    if edge_id is not None:
        query = query.where(Camera.edge_id == edge_id)
    names: dict[str, list[str]] = {}
    for edge, name in session.execute(query):
        names.setdefault(edge, []).append(name)
    return names


def _refused_filters(session: Session, edge_id: str | None = None) -> dict[str, list[str]]:
    """Edge id -> the filters that target it trained on another base model or input size (cloud.base_models)."""
    refused: dict[str, list[str]] = {}
    for name, edge in refusals(session, stored_specs(session), edge_id):
        refused.setdefault(edge, []).append(name)
    return refused
