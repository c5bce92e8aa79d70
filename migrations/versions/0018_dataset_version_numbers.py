"""The last dataset version number given to each project (assets/dataset/store.py): numbers are
allocated under this row's lock, so two builds of one project never get the same one, whichever
machine runs them and whatever the versions folder showed each of them.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"


def upgrade() -> None:
    op.create_table(
        "dataset_version_numbers",
        sa.Column(
            "project_id",
            sa.Integer,
            sa.ForeignKey(f"{_SCHEMA}.projects.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("last_number", sa.Integer, nullable=False),
        schema=_SCHEMA,
    )


def downgrade() -> None:
    op.drop_table("dataset_version_numbers", schema=_SCHEMA)
