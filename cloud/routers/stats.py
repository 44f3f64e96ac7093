"""/api/stats: counts of everything the service holds, and its persistent counters."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from cloud.auth import require
from cloud.metrics import service_stats
from cloud.routers import ConfigDep, LastHeardDep, SessionDep
from cloud.schemas import StatsOut, errors

router = APIRouter(tags=["stats"], dependencies=[Depends(require("read"))], responses=errors(401, 403, 422))


@router.get("/stats")
def stats(session: SessionDep, config: ConfigDep, last_heard: LastHeardDep) -> StatsOut:
    return service_stats(session, config, last_heard)
