"""`opperf export --format hcom`: a collective's rows in seed 001's HCCL benchmark CSV shape.

Seed 001 keeps communication timings in files named hcom_allReduce_.csv, hcom_allGather_.csv,
hcom_reduceScatter_.csv and hcom_alltoallv_.csv, with the columns message_bytes, num_devices,
Average Duration(us), topology_tier, dtype (CANN's names: DT_BF16, DT_FLOAT) and bandwidth_gbps;
num_nodes (the nodes the group spanned; 1 for rows written before the column) follows num_devices.
Average Duration(us) is the row's time_us_mean and bandwidth_gbps the algorithm bandwidth at
that time (S / mean, where S is the row's `bytes`; algbw_gbps is S / median).

>>> hcom_file("all_reduce")
'hcom_allReduce_.csv'
"""

from __future__ import annotations

import csv
import io

from pytest_opperf import dtypes as dtype_table
from pytest_opperf.catalog.ops.collective import algbw_gbps
from pytest_opperf.view.source import OpTable, ViewError

HEADER = ["message_bytes", "num_devices", "num_nodes", "Average Duration(us)", "topology_tier", "dtype",
          "bandwidth_gbps"]
# The seed's file name of each collective; the seed has none for broadcast and send_recv.
FILES = {"all_reduce": "hcom_allReduce_.csv", "all_gather": "hcom_allGather_.csv",
         "reduce_scatter": "hcom_reduceScatter_.csv", "all_to_all": "hcom_alltoallv_.csv",
         "broadcast": "hcom_broadcast_.csv", "send_recv": "hcom_sendRecv_.csv"}


def hcom_file(op: str) -> str:
    return FILES[op]


def hcom_csv(table: OpTable) -> str:
    """The table's rows in the seed's columns, by num_devices, message_bytes and dtype.

    The seed's files have no backend or timer column: a table holding rows of several backends,
    knobs or timers is refused, naming them (export from a database of one).
    """
    missing = [c for c in ("message_bytes", "num_devices", "topology_tier") if c not in table.columns]
    if missing:
        raise ViewError(f"--format=hcom: op {table.op!r} is not a collective (no column {missing[0]})")
    ways = sorted({(r["backend"], r["knobs"] or "", r["timer"]) for r in table.rows})
    if len(ways) > 1:
        named = ", ".join(f"{b}{' ' + k if k else ''} ({t})" for b, k, t in ways)
        raise ViewError(f"--format=hcom: {table.op} has rows of {len(ways)} backends or timers ({named}); "
                        f"the seed's files hold one: export from a database of one")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    for r in sorted(table.rows, key=lambda r: (r["num_devices"], r["message_bytes"], r["dtype_in"])):
        writer.writerow([r["message_bytes"], r["num_devices"], r.get("num_nodes") or 1, r["time_us_mean"],
                         r["topology_tier"],
                         _cann_dtype(r["dtype_in"]), algbw_gbps(r["bytes"], r["time_us_mean"])])
    return out.getvalue()


def _cann_dtype(name: str) -> str:
    """CANN's name of a dtype (aclDataType / ge::DataType spelling: DT_BF16); one it has none for as given."""
    try:
        return dtype_table.lookup(name).ascend or name
    except KeyError:
        return name
