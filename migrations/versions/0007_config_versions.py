"""Config versions: what config each project stage's work was done with.

`projects.fingerprints` holds, per project stage (catalog, filter, dedup, detect, dataset), a
short hash of the config that stage's output depends on (its own section, and what it reads
from upstream: the filter's covers the extraction profile, the dedup's the filter's, and so on).
A claim records its stage's fingerprint on the work item (`work_items.fingerprint`); an item
finished under another fingerprint than its project's current one is stale and is done again.
Items finished before this revision have none and count as current until their project's config
next changes (registration then stamps them with the fingerprints of the config they ran with).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"


def upgrade() -> None:
    op.add_column("projects", sa.Column("fingerprints", JSONB), schema=_SCHEMA)
    op.add_column("work_items", sa.Column("fingerprint", sa.Text), schema=_SCHEMA)


def downgrade() -> None:
    op.drop_column("work_items", "fingerprint", schema=_SCHEMA)
    op.drop_column("projects", "fingerprints", schema=_SCHEMA)
