"""Running a sweep: options, configs -> pytest's cases, the run's typed parts (env.py: what a process
that runs cases gets; controller.py: the one writer; session.py: the wiring), isolation of crashing
cases, xdist pinning, torchrun ranks and sharding. Uses config/ (the config language, pytest-free:
this layer turns its ConfigError into pytest's collection and usage errors), measure/, catalog/,
hardware/, store/ and gate/; the dtype table is pytest_opperf/dtypes.py."""
