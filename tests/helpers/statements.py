"""The SQL statements a call sends through an engine, as sent (for plan checks and for tests that
count what a quiet call reads)."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa


def statements_sent(
    engine: sa.Engine | type[sa.Engine], call: Callable[[], object]
) -> list[tuple[str, object]]:
    """(statement, parameters) of each statement `call` sends through `engine`, in order (given
    the `sa.Engine` class: through any engine of the process, those `call` makes included)."""
    sent: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        sent.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        call()
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    return sent
