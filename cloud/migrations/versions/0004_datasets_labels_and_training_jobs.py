"""Datasets made in the cloud (footage from edge cameras, uploaded clips, stored frames given as feedback), their
labels, and training jobs for the trainer service.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("edges") as batch:
        batch.add_column(sa.Column("input_size", sa.JSON(), nullable=True))
    op.create_table(
        "datasets",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("edge_id", sa.String(length=64), nullable=True),
        sa.Column("camera", sa.String(length=64), nullable=True),
        sa.Column("request", sa.String(length=64), nullable=True),
        sa.Column("every", sa.Float(), nullable=False),
        sa.Column("duration", sa.Float(), nullable=False),
        sa.Column("max_frames", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("frames", sa.Integer(), nullable=False),
        sa.Column("expected", sa.Integer(), nullable=True),
        sa.Column("fps", sa.Float(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=True),
        sa.Column("height", sa.Integer(), nullable=True),
        sa.Column("regions", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
        sa.UniqueConstraint("request"),
    )
    op.create_table(
        "dataset_frames",
        sa.Column("dataset", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("camera_frame", sa.BigInteger(), nullable=False),
        sa.Column("timestamp", sa.Float(), nullable=False),
        sa.Column("source_frame_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.ForeignKeyConstraint(["dataset"], ["datasets.name"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["source_frame_id"], ["frames.id"], name="fk_dataset_frames_source_frame_id", ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("dataset", "number"),
        sa.UniqueConstraint("source_frame_id", "dataset", name="uq_dataset_frames_source"),
    )
    op.create_table(
        "labels",
        sa.Column("dataset", sa.String(length=64), nullable=False),
        sa.Column("event", sa.String(length=64), nullable=False),
        sa.Column("frame_index", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["dataset"], ["datasets.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("dataset", "event", "frame_index"),
    )
    op.create_table(
        "training_jobs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("dataset", sa.String(length=64), nullable=False),
        sa.Column("event", sa.String(length=64), nullable=False),
        sa.Column("filter_name", sa.String(length=64), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=False),
        sa.Column("trainer", sa.String(length=64), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=True),
        sa.Column("onnx", sa.LargeBinary(), nullable=True),
        sa.Column("deployed", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["dataset"], ["datasets.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("training_jobs") as batch_op:
        batch_op.create_index(batch_op.f("ix_training_jobs_dataset"), ["dataset"], unique=False)
        batch_op.create_index("ix_training_jobs_status_created", ["status", "created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("training_jobs") as batch_op:
        batch_op.drop_index("ix_training_jobs_status_created")
        batch_op.drop_index(batch_op.f("ix_training_jobs_dataset"))

    op.drop_table("training_jobs")
    op.drop_table("labels")
    op.drop_table("dataset_frames")
    op.drop_table("datasets")
    with op.batch_alter_table("edges") as batch:
        batch.drop_column("input_size")
