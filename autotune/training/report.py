"""Held-back accuracy of trained heads, as a table."""

from __future__ import annotations


def accuracy_table(accuracy: list, title: str):
    """Rows of ``HeadScore`` (Medusa: one per head) or of a score type with another
    ``UNIT`` (EAGLE: one per draft depth); "predicts" counts from the position read."""
    from rich.table import Table

    unit = type(accuracy[0]).UNIT if accuracy else "head"
    table = Table(title=title)
    for name in (unit, "predicts", "top-1", "top-5", "positions"):
        table.add_column(name, justify="right")
    for row in accuracy:
        table.add_row(
            str(getattr(row, unit)),
            f"t+{row.offset}",
            f"{row.top1:.3f}",
            f"{row.top5:.3f}",
            str(row.positions),
        )
    return table
