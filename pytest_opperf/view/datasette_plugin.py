"""A Datasette plugin: shows the columns that `opperf datasette-metadata` names under
`opperf_digits` rounded (gflops to 0.1, ratios to 4 digits), where Datasette would print every
digit of a float. Loaded by Datasette through the entry point `datasette: opperf` when both are
installed in one environment, or with `datasette --plugins-dir DIR` holding a copy of this file.
It imports nothing of pytest-opperf, and Datasette only when Datasette loads it.
"""

from datasette import hookimpl


@hookimpl
def render_cell(value, column, table, database, datasette):
    if not isinstance(value, float) or table is None:
        return None
    try:
        digits = (datasette.metadata("opperf_digits", database=database, table=table) or {}).get(column)
    except (AttributeError, TypeError):  # a Datasette without metadata() by table: its own rendering
        return None
    if digits is None:
        return None
    return f"{value:,.{digits}f}"
