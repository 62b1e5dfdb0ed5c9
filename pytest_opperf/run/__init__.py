"""Running a sweep: options, configs -> cases, the session and its single writer, isolation of
crashing cases, xdist pinning and sharding. Uses measure/, catalog/, hardware/, store/ and gate/."""
