"""Footage frames record the edge run they were recorded in: with the camera frame index, that says which stored
(matched) frame is the same camera frame, so feedback relabels it instead of adding a second copy of it.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dataset_frames") as batch:
        batch.add_column(sa.Column("run", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dataset_frames") as batch:
        batch.drop_column("run")
