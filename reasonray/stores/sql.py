"""The one dialect shim: a record store whose SQL both databases agree on writes it once, against `Sql`.

Statements use psycopg's `%s` placeholders; `LocalSql` runs them on a machine's SQLite file (as `?`),
`PgStore` on the cluster's PostgreSQL. What the dialects spell differently is asked of the database:
a JSON value as a parameter (`jsonb`), a JSON column as read (`loads`) and the `updated_at` column
that only the PostgreSQL tables keep (`touch`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from reasonray.kernel.storage import LocalDatabase


class Sql(Protocol):
    touch: str
    """`, updated_at = now()` where the tables keep when a row changed, else empty (appended to an UPDATE's SET)."""

    async def fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...

    def jsonb(self, value: Any) -> Any: ...

    def loads(self, column: Any) -> Any: ...


class LocalSql:
    """`Sql` on a `LocalDatabase`, off the event loop (a write may wait for another process's)."""

    touch = ""

    def __init__(self, db: LocalDatabase) -> None:
        self.db = db

    async def fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        statement = sql.replace("%s", "?")
        return await asyncio.to_thread(self.db.run, lambda db: db.execute(statement, params).fetchall())

    @staticmethod
    def jsonb(value: Any) -> str:
        return json.dumps(value)

    @staticmethod
    def loads(column: Any) -> Any:
        return json.loads(column)
