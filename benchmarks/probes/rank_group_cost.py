"""What starting and closing a collective rank group costs: a group of one rank on the
device's communication backend, twice in one process (the first also starts the forkserver that
imports torch once for every rank).

    python3 benchmarks/probes/rank_group_cost.py [cuda|cpu]
"""

import sys
import time

from pytest_opperf.run.collective import RankGroup

if __name__ == "__main__":
    dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    for _ in range(2):
        t = time.perf_counter()
        g = RankGroup(1, dev, 60.0)
        t1 = time.perf_counter()
        for conn in g.conns:
            conn.send(("close", {}))
        t2 = time.perf_counter()
        for p in g.procs:
            p.join(30)
        t3 = time.perf_counter()
        print(f"{dev} group of 1: start {t1 - t:.2f}s, ranks exited {t3 - t2:.2f}s after close "
              f"(codes {[p.exitcode for p in g.procs]})", flush=True)
