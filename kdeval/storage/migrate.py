"""Bring an index created by an older schema up to date: add the columns it lacks.

``create_all`` makes missing tables but never touches existing ones, so a column added to a model later
(``cells.provenance``) is added here with ``ALTER TABLE ... ADD COLUMN``. The statement is a DDL construct
compiled by the database's own dialect from the model's column (names quoted by the dialect's preparer,
types rendered by it), never text assembled from outside input. Only nullable columns can be added this
way (existing rows get NULL).
"""
from __future__ import annotations

from sqlalchemy import Column, Engine, Table, inspect
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn, DDLElement

from kdeval.storage.tables import Base


class AddColumn(DDLElement):
    """``ALTER TABLE <table> ADD COLUMN <column spec>`` for a column of one of our models."""

    inherit_cache = False

    def __init__(self, table: Table, column: Column) -> None:
        self.table, self.column = table, column


@compiles(AddColumn)
def _compile_add_column(element: AddColumn, compiler, **kw) -> str:
    table = compiler.preparer.format_table(element.table)
    return f"ALTER TABLE {table} ADD COLUMN {compiler.process(CreateColumn(element.column), **kw)}"


def missing_columns(engine: Engine) -> list[Column]:
    """Columns of our models that the database's existing tables lack (tables it lacks are not listed)."""
    insp = inspect(engine)
    existing = set(insp.get_table_names())
    out: list[Column] = []
    for table in Base.metadata.sorted_tables:
        if table.name not in existing:
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        out.extend(c for c in table.columns if c.name not in have)
    return out


def add_missing_columns(engine: Engine) -> list[str]:
    """Add every missing (nullable) column; returns ``table.column`` of those added.

    Another process adding the same column at the same moment is tolerated."""
    added: list[str] = []
    for col in missing_columns(engine):
        if not col.nullable or col.primary_key:
            raise RuntimeError(f"index schema: cannot add non-nullable column {col.table.name}.{col.name} "
                               "to an existing table")
        try:
            with engine.begin() as conn:
                conn.execute(AddColumn(col.table, col))
        except (OperationalError, ProgrammingError):
            if any(c is col for c in missing_columns(engine)):  # still missing: a real failure
                raise
            continue  # another process added it
        added.append(f"{col.table.name}.{col.name}")
    return added
