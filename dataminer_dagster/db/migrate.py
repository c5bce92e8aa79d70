"""Schema migrations (Alembic) for the claim tables.

`ensure_schema` is what every process calls before it touches the claim tables (CLI commands, a
run's resource, a sensor's first tick). Once the schema is at head it costs one small query per
process and database, and never waits on a lock. Migrating is serialised twice:

* within a process by one lock, because Alembic's `command` API keeps module-level proxies
  (`alembic.context`, `alembic.op`) that two threads would overwrite (sensor threads did);
* across processes by a transaction-scoped advisory lock taken in the migration's own transaction,
  so it is released at commit, at rollback, and when the process dies (the server ends the
  session). A session-level lock could outlive its holder on a pooled connection and block every
  later migration for ever.
"""

from __future__ import annotations

import functools
import re
import threading
from pathlib import Path

import sqlalchemy as sa

# Any constant works; it only has to be the same in every process that migrates.
MIGRATION_LOCK_ID = 0x6461746D696E6572

_lock = threading.Lock()
_at_head: set[str] = set()  # databases (URLs) this process has seen at head


def migrations_dir() -> Path:
    """`migrations/` beside the package in a checkout, or the copy packed into the wheel."""
    package_root = Path(__file__).resolve().parents[1]
    for candidate in (package_root / "_migrations", package_root.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError(f"No Alembic migrations found near {package_root}")


def _alembic_config(connection: sa.Connection | None = None):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["connection"] = connection
    return config


# `revision = "..."` and `down_revision = "..."` (or None) as each script declares them.
_DECLARED = re.compile(r'^(down_revision|revision)\s*=\s*(?:"([^"]*)"|None)\s*$', re.MULTILINE)


@functools.cache
def head_revision() -> str:
    """The revision the code expects (read once per process from the migration scripts): the one
    no other script revises. Read from the scripts' own `revision` lines rather than through
    Alembic's script directory, which imports Alembic and every script at the start of each
    `dataminer` command (tests/db/test_migrate.py checks that both agree)."""
    revised, revisions = set(), set()
    for script in (migrations_dir() / "versions").glob("*.py"):
        declared = dict(_DECLARED.findall(script.read_text()))
        revisions.add(declared["revision"])
        revised.add(declared.get("down_revision"))
    heads = sorted(revisions - revised)
    if len(heads) != 1:
        raise RuntimeError(f"the migrations have {len(heads)} heads ({heads}); merge them")
    return heads[0]


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`; a no-op when it is already there. Safe to run from many
    threads and processes at once: one migrates, the others wait for its commit and find nothing
    left to do."""
    from alembic import command

    with _lock, engine.begin() as connection:
        # A migration takes as long as it takes, and so may the wait for another process's.
        connection.execute(sa.text("SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0"))
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
        command.upgrade(_alembic_config(connection), revision)
    if revision == "head":
        _at_head.add(_key(engine))
    else:
        _at_head.discard(_key(engine))


def ensure_schema(engine: sa.Engine) -> None:
    """Migrate unless this process already found the database at head; otherwise one cheap
    version check, and a migration only when the schema is behind."""
    key = _key(engine)
    if key in _at_head:
        return
    if current_revision(engine) == head_revision():
        _at_head.add(key)
    else:
        upgrade(engine)


def forget(engine: sa.Engine) -> None:
    """The schema of `engine` was dropped: check it again on next use."""
    _at_head.discard(_key(engine))


def current_revision(engine: sa.Engine) -> str | None:
    from dataminer_dagster.db.schema import SCHEMA

    with engine.connect() as connection:
        exists = connection.execute(
            sa.text("SELECT to_regclass(:table) IS NOT NULL"),
            {"table": f"{SCHEMA}.alembic_version"},
        ).scalar()
        if not exists:
            return None
        return connection.execute(
            sa.text(f"SELECT version_num FROM {SCHEMA}.alembic_version")
        ).scalar()


def _key(engine: sa.Engine) -> str:
    return engine.url.render_as_string(hide_password=False)
