"""Usage rows that could not be written, kept on disk until the store returns.

When a flush fails (:meth:`llmgw.router.accounts.Accounts.flush`), its rows
are appended to ``usage-<router id>.buffer`` in the router's state directory
(next to the SQLite database by default), one JSON line per row with its
reservation, and fsynced once per flush. At the next flush that reaches the
store, the file's rows are written first, in transactions of
:data:`BATCH`, and the file is removed. Each row carries its request's id,
and the store skips an id it holds (:mod:`llmgw.store.outages`): a batch
whose commit landed but whose answer was lost is not written twice, and a
torn last line (a crash mid-append) is skipped. None lost, none duplicated.

The file is bounded (:data:`MAX_BYTES`): once full, rows stay in memory, as
they did before this buffer, and one line says so (``usage buffer full``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from llmgw.store.stores import Store
from llmgw.store.usages import UsageRow

log = logging.getLogger(__name__)

MAX_BYTES = 256 * 2**20
BATCH = 1000


class UsageBuffer:
    def __init__(self, directory: Path, router_id: str, max_bytes: int = MAX_BYTES) -> None:
        self.path = directory / f"usage-{router_id}.buffer"
        self.max_bytes = max_bytes
        self.rows: list[UsageRow] = []  # what the file holds, for spend and the metric
        self._full = False

    @property
    def count(self) -> int:
        return len(self.rows)

    def append(self, rows: Sequence[UsageRow], settled: Sequence[str | None]) -> bool:
        """Append ``rows`` (``settled[i]``: ``rows[i]``'s reservation) and fsync; False when
        the file is full (the caller keeps them)."""
        lines = "".join(json.dumps({"row": asdict(r), "settled": s}) + "\n"
                        for r, s in zip(rows, settled, strict=True))
        size = self.path.stat().st_size if self.path.exists() else 0
        if size + len(lines) > self.max_bytes:
            if not self._full:
                log.error("usage buffer full (%s, %d rows): further rows stay in memory "
                          "until the store returns", self.path.name, len(self.rows))
            self._full = True
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(lines)
            out.flush()
            os.fsync(out.fileno())
        self.rows += rows
        return True

    def _read(self) -> tuple[list[UsageRow], list[str | None]]:
        rows: list[UsageRow] = []
        settled: list[str | None] = []
        if not self.path.exists():
            return rows, settled
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                doc = json.loads(line)
                row = UsageRow(**doc["row"])
            except (ValueError, TypeError, KeyError):
                log.warning("skipped a torn line of %s", self.path.name)
                continue
            rows.append(row)
            settled.append(doc.get("settled"))
        return rows, settled

    async def drain(self, store: Store) -> int:
        """Write what the file holds (StoreError: it stays for the next try); how many."""
        if not self.rows and not self.path.exists():
            return 0
        rows, settled = self._read()
        for at in range(0, len(rows), BATCH):
            await store.insert_usage(rows[at:at + BATCH], settled[at:at + BATCH])
        self.path.unlink(missing_ok=True)
        self.rows, self._full = [], False
        if rows:
            log.warning("wrote %d usage rows buffered during the store outage", len(rows))
        return len(rows)
