"""Who owns each session, agent card and workspace, and whom its owner shared it with (read-only).

`open_ownership` picks the store: PostgreSQL's `ownership` table with a store URL, else
`<data_dir>/tenancy/owners.json` (only memory without a data directory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from reasonray.kernel.storage import write_atomic
from reasonray.stores import cluster_store

if TYPE_CHECKING:
    from reasonray.stores.postgres import PgStore


class OwnerRecord(TypedDict):
    owner: str  # the owner's `sub`
    readers: list[str]  # principals it is shared with, read-only


class OwnershipRepository(Protocol):
    """Owner and read-only sharers of each resource (`kind` is session, agent or workspace), stored somewhere."""

    def get(self, kind: str, ident: str) -> OwnerRecord | None: ...

    def claim(self, kind: str, ident: str, sub: str) -> bool:
        """Make `sub` the owner of an unowned resource; True when `sub` owns it afterwards."""
        ...

    def share(self, kind: str, ident: str, readers: list[str]) -> None:
        """Replace the read-only sharers of an owned resource."""
        ...

    def drop(self, kind: str, ident: str) -> None: ...

    def readable(self, kind: str, sub: str) -> list[str]:
        """Ids of `kind` that `sub` owns or that are shared with it."""
        ...

    def owned(self, kind: str) -> set[str]:
        """Ids of `kind` that have an owner."""
        ...


class OwnershipTable:
    """`OwnershipRepository` in memory, and in a JSON file when given one (the zero-setup store of one machine)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._records: dict[str, OwnerRecord] = {}
        if path is not None and path.exists():
            self._records = json.loads(path.read_text())

    def get(self, kind: str, ident: str) -> OwnerRecord | None:
        return self._records.get(f"{kind}:{ident}")

    def claim(self, kind: str, ident: str, sub: str) -> bool:
        record = self._records.get(f"{kind}:{ident}")
        if record is None:
            self._records[f"{kind}:{ident}"] = {"owner": sub, "readers": []}
            self._save()
            return True
        return bool(record["owner"] == sub)

    def share(self, kind: str, ident: str, readers: list[str]) -> None:
        if (record := self._records.get(f"{kind}:{ident}")) is not None:
            record["readers"] = sorted(set(readers))
            self._save()

    def drop(self, kind: str, ident: str) -> None:
        if self._records.pop(f"{kind}:{ident}", None) is not None:
            self._save()

    def readable(self, kind: str, sub: str) -> list[str]:
        prefix = f"{kind}:"
        return [k[len(prefix) :] for k, r in self._records.items() if k.startswith(prefix) and (r["owner"] == sub or sub in r["readers"])]

    def owned(self, kind: str) -> set[str]:
        prefix = f"{kind}:"
        return {k[len(prefix) :] for k in self._records if k.startswith(prefix)}

    def _save(self) -> None:
        if self.path is not None:  # replaced whole, readable by its owner alone
            write_atomic(self.path, json.dumps(self._records).encode())


@dataclass
class PgOwnershipTable:
    """`OwnershipRepository` in the cluster store's `ownership` table, synchronous like its caller, the ownership
    actor, which Ray runs one call at a time so that claims never race."""

    store: PgStore

    def _rows(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return self.store.blocking(self.store.fetch(sql, params))

    def get(self, kind: str, ident: str) -> OwnerRecord | None:
        rows = self._rows("SELECT owner, readers FROM ownership WHERE kind = %s AND ident = %s", (kind, ident))
        return {"owner": rows[0][0], "readers": list(rows[0][1])} if rows else None

    def claim(self, kind: str, ident: str, sub: str) -> bool:
        # safe to retry: an insert that committed before the connection dropped is found as ours
        sql = "INSERT INTO ownership (kind, ident, owner) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING owner"
        if self._rows(sql, (kind, ident, sub)):
            return True
        current = self.get(kind, ident)
        return current is not None and current["owner"] == sub

    def share(self, kind: str, ident: str, readers: list[str]) -> None:
        self._rows("UPDATE ownership SET readers = %s WHERE kind = %s AND ident = %s", (sorted(set(readers)), kind, ident))

    def drop(self, kind: str, ident: str) -> None:
        self._rows("DELETE FROM ownership WHERE kind = %s AND ident = %s", (kind, ident))

    def readable(self, kind: str, sub: str) -> list[str]:
        sql = "SELECT ident FROM ownership WHERE kind = %s AND (owner = %s OR %s = ANY(readers)) ORDER BY ident"
        return [r[0] for r in self._rows(sql, (kind, sub, sub))]

    def owned(self, kind: str) -> set[str]:
        return {r[0] for r in self._rows("SELECT ident FROM ownership WHERE kind = %s", (kind,))}


def open_ownership(store_url: str | None, data_dir: Path | None) -> OwnershipRepository:
    """PostgreSQL with a store URL; else `<data_dir>/tenancy/owners.json` (only memory without a data directory)."""
    if store_url is not None:
        return PgOwnershipTable(cluster_store(store_url))
    return OwnershipTable(data_dir / "tenancy" / "owners.json" if data_dir is not None else None)
