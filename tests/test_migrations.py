"""Schema migrations (cloud.migrations) on start, against SQLite and the local PostgreSQL (each test in its own
schema): a fresh database, one made before migrations existed, one from a newer version, racing start-ups."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from datetime import UTC, datetime
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from cloud_server import postgres_schema
from sqlalchemy import create_engine, inspect, select, text
from sqlalchemy.engine import Connection, Engine

from cloud import migrations
from cloud.db import Base, Event, EventFrame, Received, StoredFrame, make_engine, session_factory
from cloud.framestore import FrameStore
from cloud.storage import Storage
from common.protocol import EventHeader, EventInfo, FrameHeader
from models.errors import FilterForwardError

EDGE, RUN, CAMERA = "edge-1", "run-1", "cam-1"
HEAD = ScriptDirectory(str(Path(migrations.__file__).parent)).get_current_head()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database: a SQLite file, or a fresh PostgreSQL schema (dropped after)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cloud.db'}"
        return
    with postgres_schema() as url:
        yield url


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    """Engines a test opens, disposed after it (before its PostgreSQL schema is dropped)."""
    opened: list[Engine] = []
    yield opened
    for engine in opened:
        engine.dispose()


def versions(connection: Connection) -> list[str]:
    return list(connection.scalars(text("SELECT version_num FROM alembic_version")))


def frame(seq: int, event_id: str) -> FrameHeader:
    return FrameHeader(
        edge=EDGE, run=RUN, seq=seq, camera=CAMERA, frame=seq, timestamp=seq / 10, wall_time=1e9 + seq / 10,
        scores={"red": 0.8}, events=[event_id], payload="jpeg",
    )  # fmt: skip


def event_start(seq: int, event_id: str) -> EventHeader:
    info = EventInfo(id=event_id, filter="red", camera=CAMERA, start_frame=seq, start_time=seq / 10, peak_score=0.7)
    return EventHeader(edge=EDGE, run=RUN, seq=seq, phase="start", wall_time=1e9 + seq / 10, event=info)


def test_a_fresh_database_is_upgraded_to_exactly_the_models(db_url: str, engines: list[Engine]) -> None:
    engine = make_engine(db_url)
    engines.append(engine)

    with engine.begin() as connection:
        assert versions(connection) == [HEAD]
        assert set(inspect(connection).get_table_names()) == {*Base.metadata.tables, "alembic_version"}
        context = MigrationContext.configure(connection, opts={"compare_type": True, "compare_server_default": True})
        assert compare_metadata(context, Base.metadata) == [], "the models changed without a revision"
        if connection.dialect.name == "postgresql":  # autogenerate does not compare SERIAL (SQLite has no such type)
            inspector = inspect(connection)
            tables = Base.metadata.tables.values()
            serial = {(t.name, c["name"]) for t in tables for c in inspector.get_columns(t.name) if c["autoincrement"]}
            declared = [(t.name, t.autoincrement_column) for t in tables]
            assert serial == {(name, column.name) for name, column in declared if column is not None}
        command.downgrade(migrations.alembic_config(connection), "base")
        assert inspect(connection).get_table_names() == ["alembic_version"]
        assert versions(connection) == []


def made_before_migrations(url: str, engines: list[Engine]) -> Engine:
    """A database as the cloud made it before migrations existed: FIRST's schema, no alembic_version table."""
    old = create_engine(url)
    engines.append(old)
    with old.begin() as connection:
        command.upgrade(migrations.alembic_config(connection), migrations.FIRST)
        connection.execute(text("DROP TABLE alembic_version"))
    return old


def test_a_database_from_before_migrations_is_stamped_and_keeps_its_rows(
    db_url: str, engines: list[Engine], tmp_path: Path
) -> None:
    old = made_before_migrations(db_url, engines)
    store = FrameStore(tmp_path / "store")
    path = store.write("frames", EDGE, CAMERA, "2.jpg", b"jpeg-2")
    with old.begin() as connection:  # rows as that version's storage code wrote them, in its columns
        connection.execute(
            text(
                "INSERT INTO frames (edge_id, seq, run, camera, frame_index, stream_time, captured_at, received_at,"
                " scores, path, size) VALUES (:edge, 2, :run, :camera, 2, 0.2, :at, :at, '{}', :path, 6)"
            ),
            {"edge": EDGE, "run": RUN, "camera": CAMERA, "at": datetime(2026, 11, 1, tzinfo=UTC), "path": path},
        )
        connection.execute(text("INSERT INTO received (edge_id, seq, received_at) VALUES (:edge, 2, :at)"),
                           {"edge": EDGE, "at": datetime(2026, 11, 1, tzinfo=UTC)})  # fmt: skip
    old.dispose()

    engine = make_engine(db_url)
    engines.append(engine)

    with engine.connect() as connection:
        assert versions(connection) == [HEAD]
    sessions = session_factory(engine)
    with sessions() as session:
        (kept,) = session.scalars(select(StoredFrame))
        assert (kept.seq, store.open_path(kept.path).read_bytes(), kept.fragment_id) == (2, b"jpeg-2", None)
        assert list(session.scalars(select(Received.seq))) == [2]
    # The tables were kept, not made anew: new rows go on from the old ones (ids too), with today's code.
    storage = Storage(sessions, store)
    storage.store_event(EDGE, event_start(3, "ev-1"), b"")
    storage.store_frame(EDGE, frame(4, "ev-1"), b"jpeg-4")
    with sessions() as session:
        ids = list(session.scalars(select(StoredFrame.id).order_by(StoredFrame.seq)))
        assert len(ids) == 2 and ids[1] > ids[0]
        assert [e.uid for e in session.scalars(select(Event))] == [f"{EDGE}/{RUN}/ev-1"]
        assert len(session.scalars(select(EventFrame)).all()) == 1


def test_a_database_from_before_migrations_whose_tables_differ_is_refused(db_url: str, engines: list[Engine]) -> None:
    old = made_before_migrations(db_url, engines)
    with old.begin() as connection:
        connection.execute(text("DROP TABLE counters"))
        connection.execute(text("ALTER TABLE edges ADD COLUMN owner VARCHAR(64)"))

    with pytest.raises(FilterForwardError) as refused:
        make_engine(db_url)

    message = str(refused.value)
    assert "\n" not in message
    assert "missing table counters" in message and "edges has unexpected owner" in message
    assert "database_url" in message
    assert "alembic_version" not in inspect(old).get_table_names()  # nothing was changed


def test_a_database_from_a_newer_version_is_refused(db_url: str, engines: list[Engine]) -> None:
    engines.append(make_engine(db_url))
    with engines[0].begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))

    with pytest.raises(FilterForwardError) as refused:
        make_engine(db_url)

    message = str(refused.value)
    assert "\n" not in message
    assert "schema revision 9999_from_the_future" in message and "newer version" in message
    with engines[0].connect() as connection:
        assert versions(connection) == ["9999_from_the_future"]


def start_up(url: str, barrier: Barrier) -> None:
    """A cloud start-up in its own process, released together with the others."""
    barrier.wait(timeout=60)
    make_engine(url).dispose()


def test_racing_start_ups_migrate_once(db_url: str, engines: list[Engine]) -> None:
    """Processes (as in production: Alembic's `context` is one per process) starting at once on an empty database:
    one creates the schema, the others wait for it and find it done."""
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(2)
    processes = [spawn.Process(target=start_up, args=(db_url, barrier)) for _ in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)

    assert [process.exitcode for process in processes] == [0, 0]
    engines.append(create_engine(db_url))
    with engines[0].connect() as connection:
        assert versions(connection) == [HEAD]


def add_dataset(connection: Connection, at: datetime, camera: str | None = None) -> None:
    """Dataset 'lot' as revision 0004's table holds it: an upload, or footage of edge-1's `camera`."""
    connection.execute(
        text(
            "INSERT INTO datasets (name, source, every, duration, max_frames, status, message, frames, fps, regions,"
            " created_at, updated_at, edge_id, camera) VALUES ('lot', :source, 0, 0, 0, 'complete', '', 3, 10, '{}',"
            " :at, :at, :edge, :camera)"
        ),
        {"at": at, "source": "footage" if camera else "upload", "edge": "edge-1" if camera else None, "camera": camera},
    )


def test_training_jobs_kept_through_the_upgrade_outlive_their_dataset(db_url: str, engines: list[Engine]) -> None:
    """Revision 0006: a dataset's deletion used to delete its training jobs, deployed ones (a filter's revisions)
    too; the jobs of a database from before it survive the upgrade and then the deletion of their dataset."""
    old = create_engine(db_url)
    engines.append(old)
    at = datetime(2026, 12, 1, tzinfo=UTC)
    with old.begin() as connection:
        command.upgrade(migrations.alembic_config(connection), "0005")
        add_dataset(connection, at)
        connection.execute(
            text(
                "INSERT INTO training_jobs (dataset, event, filter_name, options, status, progress, attempts, error,"
                " deployed, created_at) VALUES ('lot', 'car', 'lot-car', '{}', 'done', '{}', 1, '', :yes, :at)"
            ),
            {"at": at, "yes": True},
        )
    old.dispose()

    engine = make_engine(db_url)
    engines.append(engine)
    with engine.begin() as connection:
        assert versions(connection) == [HEAD]
        assert connection.execute(text("SELECT dataset, filter_name FROM training_jobs")).all() == [("lot", "lot-car")]
        connection.execute(text("DELETE FROM datasets WHERE name = 'lot'"))
    with engine.connect() as connection:
        assert connection.execute(text("SELECT dataset, filter_name FROM training_jobs")).all() == [(None, "lot-car")]


def test_deployed_jobs_of_an_older_database_get_their_deployment_time_and_camera(
    db_url: str, engines: list[Engine]
) -> None:
    """Revision 0007: a job records when it was last deployed (the filter runs the job deployed last) and the camera
    of its footage; a database from before it counts its deployed jobs as deployed when they finished, and takes
    the camera from their dataset."""
    old = create_engine(db_url)
    engines.append(old)
    at, done = datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, tzinfo=UTC)
    with old.begin() as connection:
        command.upgrade(migrations.alembic_config(connection), "0006")
        add_dataset(connection, at, camera="gate")
        for deployed, finished in ((True, done), (False, None)):
            connection.execute(
                text(
                    "INSERT INTO training_jobs (dataset, event, filter_name, options, status, progress, attempts,"
                    " error, deployed, created_at, finished_at) VALUES ('lot', 'car', 'lot-car', '{}', 'done', '{}',"
                    " 1, '', :deployed, :at, :finished)"
                ),
                {"at": at, "deployed": deployed, "finished": finished},
            )
    old.dispose()

    engine = make_engine(db_url)
    engines.append(engine)
    with engine.connect() as connection:
        assert versions(connection) == [HEAD]
        rows = connection.execute(text("SELECT deployed, deployed_at, camera FROM training_jobs ORDER BY id")).all()
    assert [(bool(deployed), camera) for deployed, _, camera in rows] == [(True, "gate"), (False, "gate")]
    assert str(rows[0][1]).startswith("2026-12-02") and rows[1][1] is None  # SQLite gives text, PostgreSQL a datetime
