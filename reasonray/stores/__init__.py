"""Where records are kept: one module per kind, its interface and its file/SQLite and PostgreSQL implementations."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reasonray.stores.postgres import PgStore


def cluster_store(url: str) -> PgStore:
    """The process's PostgreSQL store for `url` (`[store] url`); psycopg is imported only where one is configured."""
    from reasonray.stores.postgres import pg_store

    return pg_store(url)
