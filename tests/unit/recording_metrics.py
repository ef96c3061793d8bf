"""A `Metrics` sink that keeps what was recorded, checked against the catalogue, for tests to read back."""

from __future__ import annotations

from reasonray.kernel.telemetry import check


class RecordingMetrics:
    """Keeps what was recorded, checked against the catalogue."""

    def __init__(self) -> None:
        self.records: list[tuple[str, float, dict[str, str]]] = []

    def record(self, name: str, value: float = 1.0, **tags: str) -> None:
        check(name, tags, value)
        self.records.append((name, value, tags))

    def values(self, name: str, **tags: str) -> list[float]:
        return [v for n, v, t in self.records if n == name and all(t.get(k) == w for k, w in tags.items())]

    def total(self, name: str, **tags: str) -> float:
        return sum(self.values(name, **tags))
