"""A pytest node id, read once: its file, its test and the test's parameters.

The parameters may hold anything a case's id holds, `::` included (a replayed aten case:
`test_aten[torch-bf16-call=aten::topk.default-args=[...]]`), so a node id is split at its first
`[`: what comes before it is the path and the test (`::`-separated), what follows the parameters.

    >>> t = parse('b.py::test_aten[torch-bf16-call=aten::topk.default-args=["T:bf16[64]",50]]')
    >>> t.path, t.test, t.params
    ('b.py', 'test_aten', 'torch-bf16-call=aten::topk.default-args=["T:bf16[64]",50]')
    >>> t.name
    'test_aten[torch-bf16-call=aten::topk.default-args=["T:bf16[64]",50]]'
    >>> parse("tests/test_x.py::TestA::test_b").name, parse("test_gemm[torch]").path
    ('test_b', '')
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

ELIDED = "..."  # where the parts every row shares were left out of a name


class NodeId(NamedTuple):
    path: str  # the file, '' when the id had none
    test: str  # the test function (a class's method: the method alone)
    params: Optional[str]  # what pytest put between the brackets, None without any

    @property
    def name(self) -> str:
        """The test and its parameters, as a person calls the case: test_gemm[torch-bf16-m=8]."""
        return self.test if self.params is None else f"{self.test}[{self.params}]"


def parse(nodeid: str) -> NodeId:
    """The node id's file, test and parameters (split at the first '[': parameters may hold '::')."""
    head, bracket, tail = nodeid.partition("[")
    params = tail[:-1] if bracket and tail.endswith("]") else (tail if bracket else None)
    parts = head.split("::")
    return NodeId("::".join(parts[:1]) if len(parts) > 1 else "", parts[-1], params)


def tokens(params: str) -> list[str]:
    """The parameters' parts as pytest joined them with '-': a '-' inside brackets or quotes, or
    one that starts a negative number after '=', stays in its part.

    >>> tokens('torch-bf16-n=-1-args=["T:bf16[64,-3]",-1]')
    ['torch', 'bf16', 'n=-1', 'args=["T:bf16[64,-3]",-1]']
    """
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(params):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[({":
            depth += 1
        elif ch in "])}":
            depth -= 1
        elif ch == "-" and depth <= 0 and i > start and params[i - 1] != "=":
            out.append(params[start:i])
            start = i + 1
    out.append(params[start:])
    return out


def distinct(nodeids: Sequence[str]) -> list[str]:
    """Each case's name without the parameters that every case of its test shares, so that names
    which differ stay apart when room is short; a left-out run of parts shows as '...'. A test's
    only case, or cases all alike, keep their whole names.

    >>> distinct(["t.py::test_gemm[torch-fp16-m=1024-k=256]", "t.py::test_gemm[torch-fp16-m=1024-k=512]",
    ...           "t.py::test_gemm[torch-bf16-m=1024-k=512]", "t.py::test_add[torch-fp32-n=8]"])
    ['test_gemm[...-fp16-...-k=256]', 'test_gemm[...-fp16-...-k=512]', 'test_gemm[...-bf16-...-k=512]', 'test_add[torch-fp32-n=8]']
    """
    ids = [parse(n) for n in nodeids]
    split = [tokens(t.params) if t.params is not None else [] for t in ids]
    groups: dict[str, list[list[str]]] = {}
    for t, parts in zip(ids, split):
        groups.setdefault(t.test, []).append(parts)
    shared = {test: set(parts[0]).intersection(*parts[1:]) if len(parts) > 1 else set()
              for test, parts in groups.items()}
    return [_without(t, parts, shared[t.test]) for t, parts in zip(ids, split)]


def _without(t: NodeId, parts: list[str], shared: set) -> str:
    """t's name with the `shared` parts of its parameters left out, each run of them one '...'."""
    kept = [p for p in parts if p not in shared]
    if t.params is None or not kept or len(kept) == len(parts):
        return t.name
    out: list[str] = []
    for p in parts:
        if p not in shared:
            out.append(p)
        elif not out or out[-1] != ELIDED:
            out.append(ELIDED)
    return f"{t.test}[{'-'.join(out)}]"
