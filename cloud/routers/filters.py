"""/api/filters: register, list, read, update and delete filters (spec JSON + ONNX model uploads)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Request, Response, UploadFile, status
from sqlalchemy.orm import Session

from cloud.auth import require
from cloud.base_models import refusals
from cloud.db import Filter
from cloud.publisher import stored_spec
from cloud.registry import Registry, RegistryError, parse_spec, too_big
from cloud.routers import FORM_OVERHEAD, EachPartOnce, RegistryDep, SessionDep, body_limit_route
from cloud.schemas import FilterOut, errors

SPEC_HELP = "the filter spec as JSON text (models.filterspec.FilterSpec)"


def _model_form_limit(request: Request) -> int:
    return request.app.state.config.max_upload_bytes + FORM_OVERHEAD


def _model_form_too_big(size: int, request: Request) -> str:
    return (
        f"the request body is at least {size} bytes, over the {request.app.state.config.max_upload_bytes}-byte model "
        f"limit (max_upload_bytes) plus {FORM_OVERHEAD} bytes for the form: upload a smaller MC"
    )


# For the routers whose uploads carry an MC model: an oversized one is refused before it is read.
ModelUploadRoute = body_limit_route(_model_form_limit, _model_form_too_big)
router = APIRouter(
    prefix="/filters",
    tags=["filters"],
    route_class=ModelUploadRoute,
    responses=errors(400, 401, 403, 404, 409, 413, 422, 503, 507),
)
Reader = Depends(require("read"))
Writer = Depends(require("write"))


@router.post("", status_code=status.HTTP_201_CREATED, dependencies=[Writer, EachPartOnce])
def create_filter(
    spec: Annotated[str, Form(min_length=1, description=SPEC_HELP)],
    model: Annotated[UploadFile, File(description="the MC's ONNX model")],
    registry: RegistryDep,
    session: SessionDep,
) -> FilterOut:
    """Register a filter; its model is checked against the spec's tap, ROI and input size."""
    return filter_out(session, registry.create(parse_spec(spec), read_model(model, registry)))


@router.get("", dependencies=[Reader])
def list_filters(registry: RegistryDep, session: SessionDep) -> list[FilterOut]:
    return filters_out(session, registry.filters())


@router.get("/{name}", dependencies=[Reader])
def get_filter(name: str, registry: RegistryDep, session: SessionDep) -> FilterOut:
    return filter_out(session, registry.get(name))


@router.get(
    "/{name}/model",
    dependencies=[Reader],
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "the ONNX model"}},
)
def get_model(name: str, registry: RegistryDep) -> Response:
    row = registry.get(name)
    return Response(
        row.onnx,
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{row.name}.onnx"'},
    )


@router.put("/{name}", dependencies=[Writer, EachPartOnce])
def update_filter(
    name: str,
    spec: Annotated[str, Form(min_length=1, description=SPEC_HELP)],
    registry: RegistryDep,
    session: SessionDep,
    model: Annotated[UploadFile | None, File(description="a new ONNX model (keep the current one without)")] = None,
) -> FilterOut:
    """Replace a filter's spec (the server bumps its version) and optionally its model."""
    # A browser form with an empty file input sends an empty, unnamed part: that means "keep the model".
    given = model is not None and bool(model.filename or model.size)
    onnx = read_model(model, registry) if given else None
    return filter_out(session, registry.update(name, parse_spec(spec), onnx))


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, dependencies=[Writer])
def delete_filter(name: str, registry: RegistryDep) -> None:
    registry.delete(name)


def read_model(model: UploadFile, registry: Registry) -> bytes:
    """The uploaded model's bytes, read no further than one byte past the limit."""
    data = model.file.read(registry.max_upload_bytes + 1)
    if len(data) > registry.max_upload_bytes:
        raise RegistryError(
            status.HTTP_413_CONTENT_TOO_LARGE, too_big(model.size or len(data), registry.max_upload_bytes)
        )
    return data


def filter_out(session: Session, row: Filter) -> FilterOut:
    return filters_out(session, [(row, len(row.onnx))])[0]


def filters_out(session: Session, rows: Sequence[tuple[Filter, int]]) -> list[FilterOut]:
    """Filters as the API gives them, (row, its model's size) each, with the edges that refuse them."""
    refused: dict[str, list[str]] = {}
    for name, edge in refusals(session, [spec for row, _ in rows if (spec := stored_spec(row)) is not None]):
        refused.setdefault(name, []).append(edge)
    return [
        FilterOut(
            name=row.name,
            spec=row.spec,
            revision=row.revision,
            model_bytes=size,
            refused_by=refused.get(row.name, []),
            created_at=row.created_at,
            updated_at=row.updated_at,
        )
        for row, size in rows
    ]
