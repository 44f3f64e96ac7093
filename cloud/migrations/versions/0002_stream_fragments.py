"""Stream fragments (matched frames as H.264), the frame -> fragment link, events' peak frames, and the base
DNN each edge runs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ROW_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "fragments",
        sa.Column("id", ROW_ID, nullable=False),
        sa.Column("edge_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("run", sa.String(length=64), nullable=False),
        sa.Column("camera", sa.String(length=64), nullable=False),
        sa.Column("starts_gop", sa.Boolean(), nullable=False),
        sa.Column("first_frame", sa.BigInteger(), nullable=False),
        sa.Column("last_frame", sa.BigInteger(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("path", sa.String(length=255), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("edge_id", "seq", name="uq_fragments_edge_seq"),
    )
    with op.batch_alter_table("fragments") as batch:
        batch.create_index("ix_fragments_received_at", ["received_at"])
        batch.create_index("ix_fragments_stream", ["edge_id", "run", "camera", "seq"])
    with op.batch_alter_table("edges") as batch:
        batch.add_column(sa.Column("base_model", sa.JSON(), nullable=True))
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("peak_frame", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("frames") as batch:
        batch.add_column(sa.Column("fragment_id", ROW_ID, nullable=True))
        batch.create_index("ix_frames_fragment_id", ["fragment_id"])
        batch.create_foreign_key("fk_frames_fragment_id", "fragments", ["fragment_id"], ["id"], ondelete="SET NULL")


def downgrade() -> None:
    with op.batch_alter_table("frames") as batch:
        batch.drop_constraint("fk_frames_fragment_id", type_="foreignkey")
        batch.drop_index("ix_frames_fragment_id")
        batch.drop_column("fragment_id")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("peak_frame")
    with op.batch_alter_table("edges") as batch:
        batch.drop_column("base_model")
    op.drop_table("fragments")
