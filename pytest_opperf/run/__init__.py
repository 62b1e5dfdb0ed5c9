"""Running a sweep: options, configs -> cases, the run's typed parts (env.py: what a process that
runs cases gets; controller.py: the one writer; session.py: the wiring), isolation of crashing
cases, xdist pinning, torchrun ranks and sharding. Uses measure/, catalog/, hardware/, store/ and
gate/."""
