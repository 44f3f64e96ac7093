"""The REST API's routers, one module per resource, and the dependencies they share.

The running service's parts (cloud.app.Services) live on `app.state.services`, created by the app's lifespan.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from sqlalchemy.orm import Session

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


def not_found(message: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, message)
