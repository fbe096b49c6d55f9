"""``harness datasets``: the registered datasets, their splits, and where each is read from."""

from __future__ import annotations

from cli.options import DataDir


def datasets_command(
    data_dir: DataDir = None,
) -> None:
    # deferred: the command's library loads when it runs, not at every harness --help
    from rich.console import Console
    from rich.table import Table

    # deferred: the command's library loads when it runs, not at every harness --help
    from benchmarks.datasets import data_dir_hint, describe_sources, get_spec

    table = Table(title="harness datasets")
    for col in ("dataset", "split", "source", "corpus"):
        table.add_column(col, overflow="fold")
    last = None
    for row in describe_sources(data_dir):
        name = row["dataset"] if row["dataset"] != last else ""
        if name:
            name = f"{name}\n[dim]{get_spec(row['dataset']).description}[/]"
        table.add_row(name, row["split"], row["source"], row["corpus"])
        last = row["dataset"]
    out = Console()
    out.print(table)
    hint = data_dir_hint(data_dir)
    if hint:
        out.print(hint, highlight=False)
