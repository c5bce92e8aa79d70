"""The outputs each lease is staging (db/file_changes.py): recorded when a stage asks for a staging
path, forgotten when the item ends and its staging is removed. A row left behind is a worker that
died with its staging (or an output it set aside) on disk: once its lease is dead, the lease
reaper removes what it left beside that output, for items that no later holder will write again
(dead ones) as for the others.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"


def upgrade() -> None:
    op.create_table(
        "staged_outputs",
        sa.Column("lease_token", postgresql.UUID(as_uuid=True), primary_key=True),
        sa.Column("final_path", sa.Text, primary_key=True),
        schema=_SCHEMA,
    )


def downgrade() -> None:
    op.drop_table("staged_outputs", schema=_SCHEMA)
