"""A finished item keeps the token of the lease whose completion finished it: a holder whose
connection was lost during the COMMIT of its completion reads back, by its token, whether the
completion went through before it deletes or puts back any file (db/file_changes.py).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("work_items", sa.Column("finished_token", UUID(as_uuid=True)), schema="dataminer")


def downgrade() -> None:
    op.drop_column("work_items", "finished_token", schema="dataminer")
