"""Fragments record their GOP and their part in it, and whether every part of the GOP before them is stored: a full
edge spool can drop a GOP's first fragment (or one in the middle) and keep the rest, which then cannot be decoded.
Rows from before keep NULL GOP and part and count as playable, as they were treated.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fragments") as batch:
        batch.add_column(sa.Column("gop", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("part", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("playable", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch.create_index("ix_fragments_stream_gop", ["edge_id", "run", "camera", "gop", "part"])


def downgrade() -> None:
    with op.batch_alter_table("fragments") as batch:
        batch.drop_index("ix_fragments_stream_gop")
        batch.drop_column("playable")
        batch.drop_column("part")
        batch.drop_column("gop")
