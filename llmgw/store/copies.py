"""Copy a store into another: what ``llmgw store migrate`` does.

Keys travel as stored (id, digest, project, name, times): no secret is needed
or seen, and every key keeps working against the target. Usage rows travel in
id order, in batches, each batch in one transaction of the target together
with a marker (table ``store_copies``) saying how far this source has been
copied.

The target must be empty — unless its marker says it was filled from this
very source: then a second run **tops it up** with the keys, revocations and
usage rows written since (a daemon kept serving on the source while the first
copy ran, or until it switched stores). Anything else is refused, so two
clusters never end up merged into one database by a typo.

Usage::

    report = await copies.copy(source, target, source_name, progress=print)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.spec.quantities import count
from llmgw.store.stores import Store, StoreError

BATCH = 5000


class TargetNotEmpty(StoreError):
    """The target holds keys or usage from somewhere else."""


@dataclass(frozen=True)
class CopyReport:
    keys: int
    usage_rows: int
    top_up: bool  # True when the target had been filled from this source before


async def copy(
    source: Store, target: Store, source_name: str,
    progress: Callable[[str], None] = lambda _: None,
) -> CopyReport:
    """Copy keys and usage from ``source`` into ``target``; see the module's contract."""
    after = await target.copied_from(source_name)
    if after is None and not await target.is_empty():
        raise TargetNotEmpty(
            f"{target.where} already holds keys or usage rows not copied from "
            f"{source.where}; migrate into an empty database")
    top_up = after is not None
    start = after or 0
    key_rows = [listing.row for listing in await source.list_keys()]
    progress(f"{count(len(key_rows), 'key')} to copy" if not top_up else
             f"topping up: {count(len(key_rows), 'key')} checked, usage rows after id {start}")
    copied, first = 0, True
    while True:
        page = await source.usage_after(start, BATCH)
        if not page and not first:
            break
        rows = [row for _, row in page]
        last = page[-1][0] if page else start
        await target.import_rows(key_rows if first else [], rows, source_name, last,
                                 time.time())
        copied += len(rows)
        start, first = last, False
        if rows:
            progress(f"copied {copied} usage rows")
        if len(page) < BATCH:
            break
    return CopyReport(len(key_rows), copied, top_up)
