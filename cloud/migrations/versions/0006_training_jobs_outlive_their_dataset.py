"""Training jobs outlive their dataset: deleting a dataset set their `dataset` to NULL instead of deleting them,
as a deployed job is a revision of its filter (to roll back to) whether or not its frames are still kept.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

NAME = "fk_training_jobs_dataset"


def upgrade() -> None:
    with op.batch_alter_table("training_jobs", naming_convention={"fk": f"{NAME}_%(referred_table_name)s"}) as batch:
        batch.drop_constraint(_dataset_key(), type_="foreignkey")
        batch.alter_column("dataset", existing_type=sa.String(length=64), nullable=True)
        batch.create_foreign_key(NAME, "datasets", ["dataset"], ["name"], ondelete="SET NULL")


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM training_jobs WHERE dataset IS NULL"))
    with op.batch_alter_table("training_jobs") as batch:
        batch.drop_constraint(NAME, type_="foreignkey")
        batch.alter_column("dataset", existing_type=sa.String(length=64), nullable=False)
        batch.create_foreign_key(NAME, "datasets", ["dataset"], ["name"], ondelete="CASCADE")


def _dataset_key() -> str:
    """The name revision 0004 left on the key (it gave none): PostgreSQL's own, or, on SQLite, which keeps no name,
    the one the naming convention above gives it while the table is copied."""
    [key] = [
        key
        for key in sa.inspect(op.get_bind()).get_foreign_keys("training_jobs")
        if key["referred_table"] == "datasets"
    ]
    return key["name"] or f"{NAME}_datasets"
