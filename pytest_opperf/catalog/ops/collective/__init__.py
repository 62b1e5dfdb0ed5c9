"""The collectives (all_reduce, all_gather, ...): each rank of a process group runs the call."""
