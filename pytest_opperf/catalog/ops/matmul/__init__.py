"""The matmul ops."""
