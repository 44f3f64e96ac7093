"""An index on the fragments of one camera stream by their last frame: the storage looks up the fragment holding
a frame whose message arrived after the fragment (resent after a cloud crash).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fragments") as batch:
        batch.create_index("ix_fragments_stream_last_frame", ["edge_id", "run", "camera", "last_frame"])


def downgrade() -> None:
    with op.batch_alter_table("fragments") as batch:
        batch.drop_index("ix_fragments_stream_last_frame")
