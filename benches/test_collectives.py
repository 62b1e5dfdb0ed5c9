"""The collectives: each case runs on num_devices rank processes (see README, "Collectives").

`collective(backend)` checks the backend on every rank against the reference, times it (a
sample: the slowest rank), and records the row with algbw_gbps and busbw_gbps.
"""


def test_all_reduce(backend, collective):
    collective(backend)


def test_all_gather(backend, collective):
    collective(backend)


def test_reduce_scatter(backend, collective):
    collective(backend)


def test_all_to_all(backend, collective):
    collective(backend)


def test_broadcast(backend, collective):
    collective(backend)


def test_send_recv(backend, collective):
    collective(backend)
