"""Each dataset version number given out and not yet published, with the lease token of the build
it was given to (assets/dataset/store.py): a number whose build's lease is dead and whose folder
was never published is given again, so that a build retried after a failure (a full disk) keeps
the number its first attempt took and the numbers stay dense.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"


def upgrade() -> None:
    op.create_table(
        "dataset_version_holders",
        sa.Column(
            "project_id",
            sa.Integer,
            sa.ForeignKey(f"{_SCHEMA}.projects.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("number", sa.Integer, primary_key=True),
        sa.Column("lease_token", postgresql.UUID(as_uuid=True), nullable=False),
        schema=_SCHEMA,
    )


def downgrade() -> None:
    op.drop_table("dataset_version_holders", schema=_SCHEMA)
