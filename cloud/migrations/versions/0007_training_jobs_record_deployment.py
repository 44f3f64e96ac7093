"""Training jobs record when they were last deployed and the camera their footage came from: the filter runs the job
deployed last (a rollback deploys an older job again), which the creation order of the deployed jobs did not say,
and a job keeps its camera when its dataset is deleted.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_jobs") as batch:
        batch.add_column(sa.Column("deployed_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("camera", sa.String(length=64), nullable=True))
    # Before: the newest deployed job counted as the one the filter runs, and its dataset said the camera.
    op.execute(sa.text("UPDATE training_jobs SET deployed_at = COALESCE(finished_at, created_at) WHERE deployed"))
    op.execute(
        sa.text(
            "UPDATE training_jobs SET camera = (SELECT datasets.camera FROM datasets WHERE datasets.name = "
            "training_jobs.dataset) WHERE dataset IS NOT NULL"
        )
    )


def downgrade() -> None:
    with op.batch_alter_table("training_jobs") as batch:
        batch.drop_column("camera")
        batch.drop_column("deployed_at")
