"""The mixture-of-experts ops: routing and the token permutation around the expert GEMMs."""
