"""Copy a store into another, every table of it: what ``llmgw store migrate`` does.

Which tables travel, and which do not and why, is one list:
:mod:`llmgw.store.tables`. Rows travel as stored (keys as digests, passwords as
Argon2 hashes, sessions as token digests), so every key, login and session keeps
working against the target and no secret is needed or seen.

A copy reads the source in **one snapshot** (a daemon may go on writing to it)
and writes the target in **one transaction**: a copy that fails, whatever the
table and however far it got, leaves the target as it found it. On PostgreSQL
the sequences behind serial ids are then moved past the largest id copied.
Then, before it commits, it **verifies**: it reads every table again on both
sides (the source's snapshot, the target inside the transaction), in key order,
and compares row counts and a SHA-256 checksum that reads the same on SQLite
and PostgreSQL (:class:`llmgw.store.tables.Checksum`); a difference rolls the
whole copy back (:class:`CopyMismatch`).

The target must be empty (of the tables copied) — unless its marker (table
``store_copies``) says it was filled from this very source: then the run **tops
it up**, by each table's policy (see :mod:`llmgw.store.tables`): the rows of
append-only tables written since, the keyed rows the target lacks, revocations.
A top-up's target may have rows of its own by then (the daemon switched to it),
so there the check is that every source row is on the target: the counts and
checksums are printed, and differ where the target has more. Anything else is
refused, so two clusters never end up merged into one database by a typo.

Usage::

    report = await copies.copy(source, target, source_name, progress=print)
    print("\\n".join(copies.lines(report)))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from llmgw.spec.quantities import count
from llmgw.store import tables
from llmgw.store.stores import Store, StoreError
from llmgw.store.tableio import Shape, TableReader, TableWriter
from llmgw.store.tables import Copied, Kind
from llmgw.store.usages import COLUMNS, Record

Progress = Callable[[str], None]
Flavour = Literal["sqlite", "postgresql"]


class TargetNotEmpty(StoreError):
    """The target holds rows that were not copied from this source."""


class CopyMismatch(StoreError):
    """The target, read back inside the copy's transaction, differs from the source: the
    transaction was rolled back."""

    def __init__(self, report: CopyReport) -> None:
        self.report = report
        bad = [c.name for c in report.checks
               if (c.missing if report.top_up else not c.same)]
        super().__init__(f"the copy does not check out ({', '.join(bad)}): nothing was "
                         "written to the target")


@dataclass(frozen=True)
class Plan:
    """A copied table as both stores have it, and the kind of each of its columns."""

    spec: Copied
    source: Shape
    target: Shape
    kinds: dict[str, Kind]

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class TableCheck:
    name: str
    source_rows: int
    target_rows: int
    copied: int
    source_sum: str
    target_sum: str
    missing: int  # source rows not found on the target (a top-up's check)

    @property
    def same(self) -> bool:
        return self.source_rows == self.target_rows and self.source_sum == self.target_sum


@dataclass(frozen=True)
class CopyReport:
    top_up: bool  # True when the target had been filled from this source before
    checks: tuple[TableCheck, ...]
    left: tuple[tuple[str, int, str], ...] = field(default=())  # not copied: rows, why

    @property
    def ok(self) -> bool:
        if self.top_up:
            return all(c.missing == 0 for c in self.checks)
        return all(c.same for c in self.checks)

    def copied(self, table: str) -> int:
        return next(c.copied for c in self.checks if c.name == table)


async def copy(source: Store, target: Store, source_name: str,
               progress: Progress = lambda _: None,
               now: Callable[[], float] = time.time) -> CopyReport:
    """Copy every table of ``source`` into ``target``; see the module's contract."""
    plans, source_shapes = await _plans(source, target)
    marks = await target.copy_marks(source_name)
    async with source.reading() as reader:
        counts = {p.name: await reader.count(p.name) for p in plans}
        async with target.writing() as writer:
            if marks is None:
                await _refuse_unless_empty(writer, plans, source, target)
                progress(f"copying {len(plans)} tables, {count(sum(counts.values()), 'row')}, "
                         f"from {source.where} to {target.where} in one transaction")
                copied, new_marks = await _copy_all(reader, writer, plans, counts, progress)
            else:
                progress(f"topping up {target.where} from {source.where} (copied before up "
                         f"to {_shown_marks(marks)})")
                copied, new_marks = await _top_up(reader, writer, plans, marks, progress)
            await writer.advance_sequences([p.target for p in plans])
            await writer.mark(source_name, new_marks, now())
            progress("verifying every table on both sides before committing")
            checks = tuple([await _check(p, reader, writer, copied[p.name], marks is not None)
                            for p in plans])
            left = tuple([(name, await reader.count(name), why)
                          for name, why in tables.NOT_COPIED.items() if name in source_shapes])
            report = CopyReport(marks is not None, checks, left)
            if not report.ok:
                raise CopyMismatch(report)  # and the transaction rolls back
    return report


async def _plans(source: Store, target: Store) -> tuple[list[Plan], dict[str, Shape]]:
    found = {store.where: await store.shapes() for store in (source, target)}
    for where, shapes in found.items():
        strays = tables.unlisted(set(shapes))
        if strays:
            raise StoreError(
                f"{where} has tables this llmgw neither copies nor lists as not copied "
                f"({', '.join(strays)}): add them to llmgw.store.tables")
    source_shapes, target_shapes = found[source.where], found[target.where]
    plans = []
    for spec in tables.COPIED:
        s, t = source_shapes.get(spec.name), target_shapes.get(spec.name)
        if s is None or t is None:
            raise StoreError(f"table {spec.name} is missing from "
                             f"{source.where if s is None else target.where}")
        s_kinds = {c.name: c.kind for c in s.columns}
        t_kinds = {c.name: c.kind for c in t.columns}
        if set(s_kinds) != set(t_kinds):
            raise StoreError(f"table {spec.name} has columns {sorted(s_kinds)} on "
                             f"{source.where} but {sorted(t_kinds)} on {target.where}")
        try:
            kinds = {n: tables.merged_kind(spec.name, n, s_kinds[n], t_kinds[n])
                     for n in s_kinds}
        except ValueError as exc:
            raise StoreError(str(exc)) from None
        plans.append(Plan(spec, s, t, kinds))
    return plans, source_shapes


async def _refuse_unless_empty(writer: TableWriter, plans: Sequence[Plan], source: Store,
                               target: Store) -> None:
    # Running totals are derived from usage rows; a target that served admissions before
    # any usage holds zeros there, which the copy replaces.
    held = [f"{n} in {p.name}" for p in plans if p.spec.policy != "derived"
            for n in [await writer.count(p.name)] if n]
    if len(held) > 4:
        held[3:] = [f"and {len(held) - 3} more tables"]
    if held:
        raise TargetNotEmpty(
            f"{target.where} already holds rows not copied from {source.where} "
            f"({', '.join(held)}); migrate into an empty database")


def _convert(plan: Plan, columns: Sequence[str], rows: Sequence[Sequence[Any]],
             flavour: Flavour) -> list[tuple[Any, ...]]:
    """Rows as the target's columns take them; a located StoreError for a value they
    cannot hold (the value is not shown: it may be a client's text)."""
    kinds = [plan.kinds[c] for c in columns]
    out = []
    for n, row in enumerate(rows):
        values = []
        for column, kind, value in zip(columns, kinds, row, strict=True):
            try:
                values.append(tables.stored(value, kind, flavour))
            except tables.BadValue as exc:
                raise StoreError(
                    f"table {plan.name}, {_row_name(plan, columns, row, n)}, column "
                    f"{column}: {exc} (the column holds {kind} values); nothing was copied"
                ) from None
        out.append(tuple(values))
    return out


def _row_name(plan: Plan, columns: Sequence[str], row: Sequence[Any], n: int) -> str:
    key = plan.source.key
    if len(key) == 1 and plan.kinds[key[0]] == "int" and key[0] in columns:
        return f"the row with {key[0]} {row[list(columns).index(key[0])]}"
    return f"row {n + 1} of its batch in key order"  # a text key may be a digest or a name


async def _copy_all(reader: TableReader, writer: TableWriter, plans: Sequence[Plan],
                    counts: dict[str, int],
                    progress: Progress) -> tuple[dict[str, int], dict[str, int]]:
    copied: dict[str, int] = {}
    marks: dict[str, int] = {}
    for plan in plans:
        columns = [c.name for c in plan.source.columns]
        if plan.spec.policy == "derived":
            await writer.clear(plan.name)
        done = 0
        async for page in reader.rows(plan.source):
            await writer.insert(plan.target, columns,
                                _convert(plan, columns, page, writer.flavour))
            done += len(page)
            if done < counts[plan.name]:  # long tables show their progress
                progress(f"  {plan.name}: {done} of {counts[plan.name]} rows")
        if plan.spec.id is not None:
            marks[plan.name] = await reader.largest(plan.name, plan.spec.id) or 0
        progress(f"  {plan.name}: {count(done, 'row')}")
        copied[plan.name] = done
    return copied, marks


async def _top_up(reader: TableReader, writer: TableWriter, plans: Sequence[Plan],
                  marks: dict[str, int],
                  progress: Progress) -> tuple[dict[str, int], dict[str, int]]:
    copied: dict[str, int] = {}
    new_marks = dict(marks)
    renumbered: dict[str, dict[int, int]] = {}  # parent table: source id -> target id
    for plan in plans:
        spec = plan.spec
        before = await writer.count(plan.name)
        columns = [c.name for c in plan.source.columns]
        if spec.policy == "missing":
            async for page in reader.rows(plan.source):
                await writer.insert(plan.target, columns,
                                    _convert(plan, columns, page, writer.flavour),
                                    missing_only=True, sticky=spec.sticky)
        elif spec.policy == "append":
            assert spec.id is not None
            await _append(reader, writer, plan, marks.get(plan.name, 0), renumbered, new_marks,
                          {p.name: p.target for p in plans})
        elif spec.policy == "child":
            assert spec.parent is not None
            await _append_children(reader, writer, plan, marks.get(spec.parent[1], 0),
                                   renumbered.get(spec.parent[1]))
        copied[plan.name] = await writer.count(plan.name) - before
        if spec.policy == "derived":
            copied[plan.name] = 0  # kept by the usage rows appended
            progress(f"  {plan.name}: kept with the usage rows appended")
        else:
            progress(f"  {plan.name}: {count(copied[plan.name], 'new row')}")
    return copied, new_marks


async def _append(reader: TableReader, writer: TableWriter, plan: Plan, mark: int,
                  renumbered: dict[str, dict[int, int]], new_marks: dict[str, int],
                  shapes: dict[str, Shape]) -> None:
    """Append the rows past ``mark``: with their ids when the target wrote none past it
    itself, else with the target's next ids (remembered for the children)."""
    spec = plan.spec
    assert spec.id is not None
    own = (await writer.largest(plan.name, spec.id) or 0) > mark
    parents: set[Any] | None = None
    if spec.parent is not None:  # skip rows whose parent the target deleted since
        column, table, key = spec.parent
        keys = Shape(table, (shapes[table].column(key),), (key,))
        parents = {r[0] async for page in writer.rows(keys) for r in page}
    all_columns = [c.name for c in plan.source.columns]
    columns = [c for c in all_columns if not (own and c == spec.id)]
    is_parent = any(t.parent is not None and t.parent[1] == plan.name and t.policy == "child"
                    for t in tables.COPIED)
    mapping: dict[int, int] = {}
    async for page in reader.rows(plan.source, after=(spec.id, mark)):
        if parents is not None and spec.parent is not None:
            at = all_columns.index(spec.parent[0])
            page = [r for r in page if r[at] in parents]
        ids = [int(r[all_columns.index(spec.id)]) for r in page]
        if page:
            new_marks[plan.name] = max(new_marks.get(plan.name, 0), max(ids))
        rows = [tuple(v for c, v in zip(all_columns, r, strict=True) if c in columns)
                for r in page]
        converted = _convert(plan, columns, rows, writer.flavour)
        made = await writer.insert(plan.target, columns, converted,
                                   returning=spec.id if own and is_parent else None)
        mapping.update(zip(ids, made, strict=False))
        if plan.name == "usage":
            await writer.add_spend(_usage_records(all_columns, page))
    if own:
        renumbered[plan.name] = mapping


async def _append_children(reader: TableReader, writer: TableWriter, plan: Plan, mark: int,
                           mapping: dict[int, int] | None) -> None:
    assert plan.spec.parent is not None
    column = plan.spec.parent[0]
    columns = [c.name for c in plan.source.columns]
    at = columns.index(column)
    async for page in reader.rows(plan.source, after=(column, mark)):
        if mapping is not None:
            page = [(*r[:at], mapping[int(r[at])], *r[at + 1:]) for r in page
                    if int(r[at]) in mapping]
        await writer.insert(plan.target, columns,
                            _convert(plan, columns, page, writer.flavour))


def _usage_records(columns: Sequence[str], page: Sequence[Sequence[Any]]) -> list[Record]:
    at = [columns.index(c) for c in COLUMNS]
    return [tuple(r[i] for i in at) for r in page]


async def _check(plan: Plan, source: TableReader, target: TableReader, copied: int,
                 top_up: bool) -> TableCheck:
    names = sorted(plan.kinds)
    sums, keys = [], []
    for reader, shape in ((source, plan.source), (target, plan.target)):
        checksum = tables.Checksum()
        found: set[tuple[Any, ...]] = set()
        at = [[c.name for c in shape.columns].index(n) for n in names]
        key_at = [names.index(k) for k in shape.key]
        async for page in reader.rows(shape):
            for row in page:
                values = [tables.canonical(row[i], plan.kinds[n]) for i, n in zip(at, names,
                                                                                  strict=True)]
                checksum.add(values)
                if top_up and plan.spec.policy == "missing":
                    found.add(tuple(values[i] for i in key_at))
        sums.append(checksum)
        keys.append(found)
    missing = len(keys[0] - keys[1])
    if top_up and plan.spec.never_deleted:
        missing = max(0, sums[0].rows - sums[1].rows)
    return TableCheck(plan.name, sums[0].rows, sums[1].rows, copied, sums[0].hexdigest(),
                      sums[1].hexdigest(), missing)


def _shown_marks(marks: dict[str, int]) -> str:
    return ", ".join(f"{t} id {n}" for t, n in sorted(marks.items()))


def lines(report: CopyReport) -> list[str]:
    """The verification as a table, then what was deliberately left behind."""
    table = [("TABLE", "SOURCE", "TARGET", "COPIED", "SHA-256 SOURCE", "SHA-256 TARGET", "CHECK")]
    for c in report.checks:
        if c.same:
            verdict = "same"
        elif report.top_up and c.missing == 0:
            verdict = "target has its own too"
        elif report.top_up:
            verdict = f"MISSING {c.missing}"
        else:
            verdict = "DIFFERS"
        table.append((c.name, str(c.source_rows), str(c.target_rows), str(c.copied),
                     c.source_sum[:12], c.target_sum[:12], verdict))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    out = ["  ".join(v.rjust(w) if 1 <= i <= 3 else v.ljust(w)
                     for i, (v, w) in enumerate(zip(r, widths, strict=True))).rstrip()
           for r in table]
    for name, rows, why in report.left:
        if rows:
            out.append(f"not copied: {name} ({count(rows, 'row')}): {why}")
    return out
