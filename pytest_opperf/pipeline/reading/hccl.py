"""Ascend collectives (``hcom_*`` kernels) sized from the profiler's communication files.

kernel_details.csv writes ``N/A`` for the tensors of most ``hcom_*`` kernels; the profiler's
``ASCEND_PROFILER_OUTPUT/communication.json`` holds, per op (``hcom_allReduce__170_1_1@<group>``),
the bytes this rank sent over each link type (``Communication Bandwidth Info`` -> ``HCCS``,
``RDMA``, ``PCIE``, ``SIO``: ``Transit Size(MB)``, MB = 10^6 bytes; ``SDMA`` is the engine that
carried the HCCS traffic, so it is not added again). The part after ``@`` names the op's
communication group: a key of ``profiler_metadata.json``'s ``parallel_group_info`` (newer
torch_npu, and the DB export), else a group whose ranks ``communication_matrix.json`` lists for
that suffix (links ``"<src>-<dst>"`` in group ranks), matched to ``parallel_group_info`` by its
size and this rank's place in it. A ring algorithm sends, per rank, of a message of S bytes on n
ranks: all_reduce 2(n-1)/n S, reduce_scatter and all_to_all (n-1)/n S (S: the whole send
buffer), all_gather (n-1) S (S: what each rank contributes), broadcast and point-to-point S; the
message is read back from what was sent with these factors (the catalogue's ``message_bytes``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

LINKS = ("HCCS", "RDMA", "PCIE", "SIO")


@dataclass
class Run:
    """What one rank's communication files say: per op name, its group and the bytes it sent."""

    sent: dict = field(default_factory=dict)      # op name (no @suffix) -> (group key, bytes sent)
    matrix: dict = field(default_factory=dict)    # group key -> set of "src-dst" link keys
    groups: dict = field(default_factory=dict)    # parallel_group_info of profiler_metadata.json
    source: str = ""                              # the communication.json, for the note


def read_run(directory: Path) -> Optional[Run]:
    """The communication files of the ASCEND_PROFILER_OUTPUT folder DIRECTORY; None without them."""
    comm = directory / "communication.json"
    if not comm.is_file():
        return None
    run = Run(source=f"{comm.name} of {directory.parent.name}")
    for step in _json(comm).values():
        for ops in (step or {}).values() if isinstance(step, dict) else ():
            for key, body in (ops or {}).items():
                if "@" not in key or not isinstance(body, dict):
                    continue  # "Total Op Info"
                name, _, group = key.partition("@")
                links = body.get("Communication Bandwidth Info") or {}
                sent = sum(float((links.get(link) or {}).get("Transit Size(MB)") or 0) for link in LINKS)
                if not sent:
                    sent = float((links.get("SDMA") or {}).get("Transit Size(MB)") or 0)
                run.sent[name] = (group, sent * 1e6)
    matrix = directory / "communication_matrix.json"
    if matrix.is_file():
        for step in _json(matrix).values():
            for ops in (step or {}).values() if isinstance(step, dict) else ():
                for key, links in (ops or {}).items():
                    if "@" in key and isinstance(links, dict):
                        run.matrix.setdefault(key.partition("@")[2], set()).update(links)
    meta = directory.parent / "profiler_metadata.json"
    if meta.is_file():
        run.groups = _json(meta).get("parallel_group_info") or {}
    return run


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(run: Optional[Run], name: str, op_type: str) -> dict:
    """What the mapping reads for one hcom kernel: message_bytes, ranks and group, or why not."""
    if run is None:
        return {"why": "the message size is not in kernel_details.csv (its tensors are N/A) and there is no "
                       "communication.json beside it: keep the profiler's ASCEND_PROFILER_OUTPUT folder whole"}
    if name not in run.sent:
        return {"why": f"{name} is not in {run.source}: its message size is unknown"}
    group, sent = run.sent[name]
    ranks, label = _group(run, group)
    if ranks is None:
        return {"why": f"the group of {name} (@{group}) is neither in profiler_metadata.json's parallel_group_info "
                       f"nor in communication_matrix.json: pass --world-size N and a mapping rule with the size"}
    if ranks == 1:
        return {"why": f"{name} runs in a group of one rank ({label}): it moves no data"}
    message = _message(op_type, sent, ranks)
    if not message:
        return {"why": f"{run.source} shows no bytes sent by this rank for {name} (group {label} of {ranks} ranks): "
                       f"its message size is unknown", "ranks": ranks, "group": label}
    return {"message_bytes": message, "ranks": ranks, "group": label, "from": run.source}


def _group(run: Run, group: str) -> tuple:
    """(ranks in the group, its name) for an @suffix; (None, "") when nothing tells."""
    info = run.groups.get(group)
    if isinstance(info, dict) and isinstance(info.get("global_ranks"), list):
        return len(info["global_ranks"]), str(info.get("group_name") or group)
    links = run.matrix.get(group)
    if not links:
        return None, ""
    pairs = [tuple(int(r) for r in link.split("-")) for link in links if _pair(link)]
    members = {r for pair in pairs for r in pair}
    mine = {src for src, _ in pairs}
    size = len(members)
    local = mine.pop() if len(mine) == 1 else None
    names = sorted({str(g.get("group_name")) for g in run.groups.values() if isinstance(g, dict)
                    and len(g.get("global_ranks") or []) == size and (local is None or g.get("group_rank") == local)})
    return size, "/".join(names) if names else f"@{group}"


def _pair(link: str) -> bool:
    src, _, dst = link.partition("-")
    return src.isdigit() and dst.isdigit()


def _message(op_type: str, sent: float, n: int) -> int:
    """The message (the catalogue's message_bytes) that makes a rank send SENT bytes on n ranks.

    >>> _message("hcom_allReduce_", 622329856.0, 2), _message("hcom_allGather_", 300.0, 4)
    (622329856, 100)
    >>> _message("hcom_reduceScatter_", 300.0, 4), _message("hcom_batchSendRecv_", 8388608.0, 2)
    (400, 8388608)
    """
    kind = op_type.lower()
    if "allreduce" in kind:
        size = sent * n / (2 * (n - 1))
    elif "allgather" in kind:
        size = sent / (n - 1)
    elif "reducescatter" in kind or "alltoall" in kind:
        size = sent * n / (n - 1)
    else:
        size = sent
    return int(round(size))
