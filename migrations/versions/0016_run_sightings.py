"""When the lease reaper first saw each unfinished Dagster run in its status, on the database's
clock: a run's start grace and queue timeout are judged from it (engine/run_health.py), never from
the run record's times, which the run worker's clock wrote (a worker whose clock is behind would
get less grace than it is owed).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"


def upgrade() -> None:
    op.create_table(
        "run_sightings",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("status", sa.Text, primary_key=True),
        sa.Column(
            "seen_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=_SCHEMA,
    )


def downgrade() -> None:
    op.drop_table("run_sightings", schema=_SCHEMA)
