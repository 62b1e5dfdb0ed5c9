"""The collectives (all_reduce, all_gather, ...): each rank of a process group runs the call.

What the rest of the package needs of them (the run layer, exports) is named here; `_common`
is the helpers the op files share.
"""

from pytest_opperf.catalog.ops.collective._common import (ALL_SIZES, COLLECTIVES, Collective, algbw_gbps, divisible,
                                                          is_collective)

__all__ = ["ALL_SIZES", "COLLECTIVES", "Collective", "algbw_gbps", "divisible", "is_collective"]
