"""The data directory the database serves: one row, written at first use (db/served_data.py). The
database records the files of one data directory (paths relative to it); a home with another
data directory (a second machine with its own disk) is refused with an error naming both, instead
of recording files the others cannot see.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"


def upgrade() -> None:
    op.create_table(
        "served_data_dir",
        sa.Column("singleton", sa.Boolean, primary_key=True, server_default=sa.true()),
        sa.Column("marker", sa.Text, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint("singleton", name="served_data_dir_one_row"),
        schema=_SCHEMA,
    )


def downgrade() -> None:
    op.drop_table("served_data_dir", schema=_SCHEMA)
