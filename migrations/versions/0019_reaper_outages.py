"""What each lease reaper saw of the database: when its last pass began and when the last outage
it met ended (it could not reach or write to the database). A run's silence is counted only from
the end of such an outage, or from the database's start, whichever is later (db/run_liveness.py),
so that a database restart or outage fails no run and consumes no attempt.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"


def upgrade() -> None:
    op.create_table(
        "reaper_outages",
        sa.Column("reaper", sa.Text, primary_key=True),
        sa.Column(
            "passed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("outage_ended_at", sa.DateTime(timezone=True)),
        sa.Column("outage_s", sa.Float),
        schema=_SCHEMA,
    )


def downgrade() -> None:
    op.drop_table("reaper_outages", schema=_SCHEMA)
