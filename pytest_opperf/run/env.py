"""What a process that runs cases is handed: the run's fixed environment, and one case's.

Every process that runs cases (the one process without xdist, each xdist worker, each torchrun
rank) builds one `RunEnv` in pytest_configure; the fixtures give each case a `CaseEnv`:

    env = RunEnv(settings, device, run_id="3f2a...", placement={"worker": "gw0", "gpu": 0},
                 rootpath=Path("."), activity=Activity(), db_path=Path("results/h100.db"))
    case_env = env.for_case(case, config, seed_offset=0)
    case_env.dtypes.output, case_env.seed

Both are frozen: a case cannot change what the next one runs with. What only the writing
process holds (records, the writer, notes) is run/controller.py's.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pytest_opperf.case import Case
from pytest_opperf import dtypes as dtype_table
from pytest_opperf.catalog.registry import DTypes
from pytest_opperf.measure import timers
from pytest_opperf.run.activity import Activity
from pytest_opperf.run.device import DeviceContext
from pytest_opperf.run.options import Settings


@dataclass(frozen=True)
class RunEnv:
    """The run as every process that runs cases sees it; fixed for the session."""

    settings: Settings
    device: DeviceContext  # spec, torch device, monitor, clock warmer, memory budget
    run_id: str
    placement: dict  # worker, gpu, gpu_uuid, rank, num_nodes: the columns every row of this process carries
    rootpath: Path
    activity: Activity  # the running case's phase, for the progress line
    db_path: Path  # results/<device>.db
    world: Optional[Any] = None  # run/ranks.py's Rank under torchrun: this process in the world

    @property
    def torch(self) -> Any:
        """The torch device the cases run on."""
        return self.device.torch

    def reference_timer(self) -> str:
        """The timer of the gate's reference kernels: the run's, or the device's default."""
        timer = self.settings.timer
        return timer if timer != "auto" else timers.default_timer(self.device.type)

    def for_case(self, case: Case, config: Any, seed_offset: int = 0) -> "CaseEnv":
        """The environment of one case: its config (from collection) and its inputs' seed
        (`seed_offset`: the gate's confirmation rounds draw other inputs)."""
        return CaseEnv(self, case, config, dtypes_of(case), case_seed(self.settings.seed + seed_offset, case))


@dataclass(frozen=True)
class CaseEnv:
    """One case as `bench`, `collective` and the `inputs` fixture see it."""

    run: RunEnv
    case: Case
    config: Optional[Any]  # the OpConfig the case came from (None: a case made outside collection)
    dtypes: DTypes
    seed: int  # the inputs' generator seed

    @property
    def settings(self) -> Settings:
        return self.run.settings

    @property
    def device(self) -> DeviceContext:
        return self.run.device


@functools.lru_cache(maxsize=None)
def _dtypes(dtype_in: str, dtype_out: str) -> DTypes:
    return DTypes(dtype_table.lookup(dtype_in), dtype_table.lookup(dtype_out))


def dtypes_of(case: Case) -> DTypes:
    """The case's input and output dtypes, from the dtype table."""
    return _dtypes(case.dtype_in, case.dtype_out)


def case_seed(seed: int, case: Case) -> int:
    """A stable per-case seed: the same case gets the same inputs in every process, and every
    backend and knob setting of a shape the same inputs (Case.inputs_key)."""
    return (seed * 1_000_003 + zlib.crc32(case.inputs_key.encode())) % (2**63)
