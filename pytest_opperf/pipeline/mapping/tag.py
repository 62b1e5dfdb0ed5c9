"""A pytest plugin for the replay run: each row it writes carries the ids of the signatures it replays.

``opperf import --configs DIR`` writes ``DIR/signatures.json`` beside the configs: the import's
token (a column of the profile database's ``imports``) and, per planned case (op, backend, dtype,
parameters), the ids of the signatures it replays. The replay run loads this module
(``pytest benches/ ... -p pytest_opperf.pipeline.mapping.tag --opperf-signatures=DIR/signatures.json``)
and puts ``{"profile": token, "signatures": [ids]}`` into each such row's ``extra_info``. ``opperf
backfill`` then takes a signature's time from the rows that carry its id and its import's token,
in the cache state chosen for it: no join by parameters, no row of another run or state. A row
is tagged whatever state it ran in (``--opperf-cache=hot`` on the cold configs tags hot rows), so
one replay run can time every signature in both states; backfill still takes only the chosen one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TABLE = "signatures.json"


def case_key(op: str, backend: str, dtype: str, params: dict) -> str:
    """One text per planned case; the replayed row's fields give the same text.

    >>> case_key("gemm", "torch", "bf16", {"m": 8.0, "n": 4})
    '["gemm", "torch", "bf16", {"m": 8, "n": 4}]'
    """
    plain = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in params.items()}
    return json.dumps([op, backend, dtype, plain])


def write_table(path: Path, cases: list, token: str) -> None:
    """DIR/signatures.json from (PlannedCase, signature id) pairs."""
    table: dict[str, list] = {}
    for case, sig_id in cases:
        table.setdefault(case_key(case.op, case.backend, case.dtype, dict(case.params)), []).append(sig_id)
    path.write_text(json.dumps({"profile": token, "cases": table}, indent=1) + "\n")


def read_table(path: str) -> dict:
    """--opperf-signatures=FILE, read; a file that is not one is the option's usage error (argparse
    reports it as one line, which pytest shows without a traceback)."""
    try:
        table = json.loads(Path(path).read_text())
        if not isinstance(table.get("profile"), str) or not isinstance(table.get("cases"), dict):
            raise ValueError("expected 'profile' (a token) and 'cases' (a mapping)")
    except (OSError, ValueError, AttributeError) as exc:
        raise argparse.ArgumentTypeError(f"{path}: not a signatures.json of opperf import --configs ({exc})") from None
    return table


# The plugin's hooks. This module is a pytest plugin without importing pytest: the pipeline layer
# runs in any process (tests/test_layers.py).

def pytest_addoption(parser) -> None:
    parser.getgroup("opperf").addoption(
        "--opperf-signatures", metavar="FILE", type=read_table,
        help="signatures.json of opperf import --configs: tag each replayed row with its signature ids")


def pytest_opperf_update_record(config, record: dict) -> None:
    """Tag a replayed row with the signatures it replays (rows of other cases are left alone)."""
    table = config.getoption("opperf_signatures")
    if not table:
        return  # the plugin loaded without the file: nothing to tag with (backfill says what to run)
    dtype = record["dtype_in"] if record["dtype_in"] == record["dtype_out"] else \
        f"{record['dtype_in']}-{record['dtype_out']}"
    ids = table["cases"].get(case_key(record["op"], record["backend"], dtype, record.params))
    if ids:
        record["extra_info"] = {**(record.get("extra_info") or {}), "profile": table["profile"], "signatures": ids}
