"""The schema as cloud.db's models made it with create_all before migrations existed.

Revision ID: 0001
Revises:
Create Date: 2026-11-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a BIGSERIAL.
ROW_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "filters",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("onnx", sa.LargeBinary(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "filter_changes",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=8), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("version"),
    )
    op.create_table(
        "edges",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("run", sa.String(length=64), nullable=False),
        sa.Column("public_key", sa.String(length=64), nullable=True),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("filters_version", sa.Integer(), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "cameras",
        sa.Column("edge_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["edge_id"], ["edges.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("edge_id", "name"),
    )
    op.create_table(
        "frames",
        sa.Column("id", ROW_ID, nullable=False),
        sa.Column("edge_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("run", sa.String(length=64), nullable=False),
        sa.Column("camera", sa.String(length=64), nullable=False),
        sa.Column("frame_index", sa.BigInteger(), nullable=False),
        sa.Column("stream_time", sa.Float(), nullable=False),
        sa.Column("captured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("scores", sa.JSON(), nullable=False),
        sa.Column("path", sa.String(length=255), nullable=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("edge_id", "seq", name="uq_frames_edge_seq"),
    )
    op.create_index("ix_frames_camera_received", "frames", ["camera", "received_at"])
    op.create_index("ix_frames_received_at", "frames", ["received_at"])
    op.create_table(
        "events",
        sa.Column("id", ROW_ID, nullable=False),
        sa.Column("uid", sa.String(length=300), nullable=False),
        sa.Column("edge_id", sa.String(length=64), nullable=False),
        sa.Column("run", sa.String(length=64), nullable=False),
        sa.Column("filter", sa.String(length=64), nullable=False),
        sa.Column("camera", sa.String(length=64), nullable=False),
        sa.Column("start_frame", sa.BigInteger(), nullable=False),
        sa.Column("start_time", sa.Float(), nullable=False),
        sa.Column("end_frame", sa.BigInteger(), nullable=True),
        sa.Column("end_time", sa.Float(), nullable=True),
        sa.Column("peak_score", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("clip_path", sa.String(length=255), nullable=True),
        sa.Column("clip_size", sa.Integer(), nullable=False),
        sa.Column("start_notified", sa.Boolean(), nullable=False),
        sa.Column("end_notified", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("uid"),
    )
    op.create_index("ix_events_filter_camera_start", "events", ["filter", "camera", "started_at"])
    op.create_table(
        "event_frames",
        sa.Column("event_uid", sa.String(length=300), nullable=False),
        sa.Column("frame_id", ROW_ID, nullable=False),
        sa.ForeignKeyConstraint(["frame_id"], ["frames.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("event_uid", "frame_id"),
    )
    op.create_index("ix_event_frames_frame_id", "event_frames", ["frame_id"])
    op.create_table(
        "received",
        sa.Column("edge_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("edge_id", "seq"),
    )
    op.create_index("ix_received_received_at", "received", ["received_at"])
    op.create_table(
        "counters",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    # Referencing tables before the ones they reference; a table's indexes go with it.
    op.drop_table("counters")
    op.drop_table("received")
    op.drop_table("event_frames")
    op.drop_table("events")
    op.drop_table("frames")
    op.drop_table("cameras")
    op.drop_table("edges")
    op.drop_table("filter_changes")
    op.drop_table("filters")
