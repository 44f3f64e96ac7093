"""An index on the frames of one camera stream by frame index: the storage looks a frame's other rows up by it
(a frame several filters match; the frames an arriving fragment holds).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("frames") as batch:
        batch.create_index("ix_frames_stream_index", ["edge_id", "run", "camera", "frame_index"])


def downgrade() -> None:
    with op.batch_alter_table("frames") as batch:
        batch.drop_index("ix_frames_stream_index")
