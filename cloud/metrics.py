"""The service's numbers: the /api/stats summary and the Prometheus collector behind /metrics.

The collector reads its values at scrape time (the ingest's and notifier's in-memory counts, the DB's
persistent counters and row counts), so nothing has to be kept in sync; it lives in a per-app
CollectorRegistry, never the process-global one, so several apps can run in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from cloud.config import CloudConfig
from cloud.db import Camera, Counter, Edge, Event, Filter, StoredFrame, utcnow
from cloud.liveness import LastHeard
from cloud.retention import stored_bytes
from cloud.schemas import StatsOut

PREFIX = "filterforward"


def online_cutoff(config: CloudConfig, now: datetime | None = None) -> datetime:
    """Edges last heard at or after this instant are online."""
    return (now or utcnow()) - timedelta(seconds=config.zmq.edge_timeout)


def service_stats(session: Session, config: CloudConfig, last_heard: LastHeard) -> StatsOut:
    def count(model: type, *where: object) -> int:
        return session.scalar(select(func.count()).select_from(model).where(*where)) or 0

    cutoff = online_cutoff(config)
    return StatsOut(
        filters=count(Filter),
        edges=count(Edge),
        edges_online=count(Edge, or_(Edge.last_seen >= cutoff, Edge.id.in_(last_heard.since(cutoff)))),
        cameras=count(Camera),
        events=count(Event),
        frames=count(StoredFrame),
        stored_bytes=stored_bytes(session),  # fragments too: the default `stream` encoding stores nothing else
        counters={name: value for name, value in session.execute(select(Counter.name, Counter.value))},
    )


class ServiceCollector(Collector):
    """Prometheus metrics of one running service."""

    def __init__(
        self,
        sessions: sessionmaker,
        config: CloudConfig,
        counts: Mapping[str, Callable[[], Mapping[str, float]]],
        last_heard: LastHeard,
    ) -> None:
        self._sessions = sessions
        self._config = config
        self._last_heard = last_heard
        self._counts = counts  # source name ("ingest", "notify") -> its live counts

    def collect(self) -> Iterator[Metric]:
        for source, read in self._counts.items():
            family = CounterMetricFamily(
                f"{PREFIX}_{source}", f"{source} counts since the service started", labels=["count"]
            )
            for name, value in sorted(dict(read()).items()):
                family.add_metric([name], float(value))
            yield family
        with self._sessions() as session:
            stats = service_stats(session, self._config, self._last_heard)
        stored = CounterMetricFamily(
            f"{PREFIX}_stored_counter", "persistent counters kept in the database", labels=["name"]
        )
        for name, value in stats.counters.items():
            stored.add_metric([name], float(value))
        yield stored
        for field in ("filters", "edges", "edges_online", "cameras", "events", "frames", "stored_bytes"):
            yield GaugeMetricFamily(f"{PREFIX}_{field}", f"{field.replace('_', ' ')} now", value=getattr(stats, field))
