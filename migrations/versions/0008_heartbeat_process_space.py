"""The process space of a run's heartbeat: where its pid can be looked up.

`run_heartbeats.process_space` holds the boot id of the machine and the pid namespace of the
process that beats (core/process_liveness.py). A lease reaper in the same process space finds a
killed run's process gone at once, instead of waiting for `leases.stale_after_s` of silence. Rows
without one (written before this revision, or on a system that does not say) are judged by their
silence only, as before.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"


def upgrade() -> None:
    op.add_column("run_heartbeats", sa.Column("process_space", sa.Text), schema=_SCHEMA)


def downgrade() -> None:
    op.drop_column("run_heartbeats", "process_space", schema=_SCHEMA)
