"""The cloud's schema migrations (Alembic), run by cloud.db.make_engine on every start.

Alembic is configured from Python (no alembic.ini), so this works from an installed package. A new revision:
change the models in cloud/db.py, then, against a database at head (make_engine brings it there),

    with make_engine(url).connect() as connection:
        command.revision(alembic_config(connection), "what changed", autogenerate=True, rev_id="0002")

then review and `ruff format` the file it writes under versions/; tests/test_migrations.py checks that head
matches the models.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import column, create_engine, func, inspect, select, table
from sqlalchemy.engine import Connection, Engine

from models.errors import FilterForwardError

log = logging.getLogger(__name__)

FIRST = "0001"  # the schema that cloud.db's create_all made before migrations existed
VERSION_TABLE = "alembic_version"
# pg_advisory_xact_lock key ("FFMI"): one start-up at a time migrates a PostgreSQL database.
PG_LOCK = 0x46464D49


def alembic_config(connection: Connection) -> Config:
    """Alembic's configuration for running migrations on `connection`, inside the transaction it is in."""
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    config.attributes["connection"] = connection
    return config


def upgrade(engine: Engine) -> None:
    """Bring the database to the newest revision in one transaction, one start-up at a time. A database made
    before migrations existed (our tables, no revision) is stamped at FIRST if its tables are FIRST's.
    FilterForwardError if it is at a revision this code does not know, or holds tables of ours that differ."""
    with engine.connect() as connection:
        is_sqlite = connection.dialect.name == "sqlite"
        if is_sqlite:
            # Foreign keys off for batch migrations, which copy a table and drop the old one: the drop would
            # cascade. The pragma does nothing inside a transaction, hence before BEGIN; IMMEDIATE takes the
            # write lock now, so a second start-up waits here (busy timeout) and then finds the work done.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        elif connection.dialect.name == "postgresql":
            # Held until commit; PostgreSQL's DDL is transactional, so a waiter then sees all of it or none.
            connection.execute(select(func.pg_advisory_xact_lock(PG_LOCK)))
        config = alembic_config(connection)
        script = ScriptDirectory.from_config(config)
        # Read directly: the table list is needed anyway, and Alembic's MigrationContext logs on every start.
        tables = set(inspect(connection).get_table_names())
        versions = table(VERSION_TABLE, column("version_num"))
        current = set(connection.scalars(select(versions.c.version_num))) if VERSION_TABLE in tables else set()
        unknown = current - {revision.revision for revision in script.walk_revisions()}
        if unknown:
            raise FilterForwardError(
                f"the database is at schema revision {', '.join(sorted(unknown))}, which this FilterForward does "
                "not know (a newer version upgraded it): run that version or a newer one, or restore a backup "
                "from before that upgrade"
            )
        if not current and tables:
            current = _stamp_if_made_before_migrations(connection, config, tables)
        head = script.get_current_head()  # one line of revisions: several heads are refused here
        if current != {head}:
            command.upgrade(config, "head")
            if current:  # a fresh database's schema is no news
                log.info("upgraded the database schema from revision %s to %s", ", ".join(sorted(current)), head)
        connection.commit()
        if is_sqlite:
            connection.exec_driver_sql("PRAGMA foreign_keys=ON")  # the connection goes back to the pool


def _stamp_if_made_before_migrations(connection: Connection, config: Config, tables: set[str]) -> set[str]:
    """Stamp the database at FIRST if `tables` (those it has) include FIRST's, and return its revisions now: {FIRST},
    or none if it has none of FIRST's tables."""
    expected = _first_schema()
    present = tables & expected.keys()
    if not present:
        return set()
    problems = [f"missing table {name}" for name in sorted(expected.keys() - present)]
    inspector = inspect(connection)
    for name in sorted(present):
        columns = {column["name"] for column in inspector.get_columns(name)}
        if missing := expected[name] - columns:
            problems.append(f"{name} lacks {', '.join(sorted(missing))}")
        if extra := columns - expected[name]:
            problems.append(f"{name} has unexpected {', '.join(sorted(extra))}")
    if problems:
        raise FilterForwardError(
            "the database has FilterForward tables but no schema revision, and they differ from the schema that "
            f"FilterForward made before migrations ({'; '.join(problems)}): point database_url at another "
            "database, or move those tables out of the way"
        )
    command.stamp(config, FIRST)
    log.info("recognised the database as made before schema migrations: stamped it at revision %s", FIRST)
    return {FIRST}


def _first_schema() -> dict[str, set[str]]:
    """Table -> column names of revision FIRST, read off a scratch in-memory SQLite database it is run on (the
    revision itself is the record of that schema)."""
    log.debug("running revision %s on a scratch in-memory SQLite database to read its tables", FIRST)
    scratch = create_engine("sqlite://")
    try:
        with scratch.begin() as connection:
            command.upgrade(alembic_config(connection), FIRST)
            inspector = inspect(connection)
            return {
                name: {column["name"] for column in inspector.get_columns(name)}
                for name in inspector.get_table_names()
                if name != VERSION_TABLE
            }
    finally:
        scratch.dispose()
