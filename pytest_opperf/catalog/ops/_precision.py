"""Rounding of the dtypes, and the check's bound for reductions built on it (GEMMs, attention).

The unit roundoff u of a float dtype is half its machine epsilon: round-to-nearest puts every
result within a relative u of the exact one (fp32 2^-24, tf32 and fp16 2^-11, bf16 2^-8,
fp8 e4m3 2^-4).

A dot product of length k accumulated one term after the other in precision u_acc has a
normwise relative error of about sqrt(k/6) * u_acc on random data (each addition rounds a
partial sum whose size grows like sqrt(j); the k errors are independent), so sqrt(k) * u_acc
bounds it with room. The output is then rounded once more to its dtype (within u_out), and
cuBLAS may sum split-K partial results in the output precision (torch allows it by default for
fp16 and bf16): 4 * u_out covers a handful of those roundings. Hence, for a reduction of
length k:

    tolerance = 4 * u_out + sqrt(k) * u_acc

u_acc is the accumulator's roundoff, not the input's: tensor cores and CPU BLAS multiply fp16,
bf16 and fp32 inputs exactly and add in fp32 (2^-24); Hopper's fp8 tensor cores keep about 14
bits while they add (DeepSeek-V3 technical report, arXiv:2412.19437, section 3.3.2), so fp8
inputs take 2^-14. Measured on random inputs (CPU, torch 2.13): a bf16 GEMM lands at 0.43 u_out
for every k from 64 to 16384, and one accumulated in bf16 itself at about 0.3 sqrt(k) u_bf16
(0.037 at k = 1024): a bound of sqrt(k) * u_in would let such a kernel, or one 10% off, pass.
Integer GEMMs are exact: their bound is 0.
"""

from __future__ import annotations

import math

# Hopper's fp8 tensor-core accumulator keeps about 14 bits (DeepSeek-V3 report, 3.3.2).
FP8_ACCUMULATOR_ROUNDOFF = 2.0**-14
FP32_ROUNDOFF = 2.0**-24


def unit_roundoff(dtype) -> float:
    """Half the machine epsilon of a catalog DType; 0 for integers.

    >>> from pytest_opperf.dtypes import lookup
    >>> unit_roundoff(lookup("bf16")) == 2**-8, unit_roundoff(lookup("tf32")) == 2**-11
    (True, True)
    """
    import torch

    if not dtype.is_float:
        return 0.0
    if dtype.name == "tf32":  # stored as float32, multiplied with a 10-bit mantissa
        return 2.0**-11
    return torch.finfo(dtype.torch).eps / 2


def accumulator_roundoff(dtype) -> float:
    """Roundoff of the sums a tensor core or BLAS keeps for inputs of this dtype."""
    if not dtype.is_float:
        return 0.0
    if dtype.itemsize == 1:
        return FP8_ACCUMULATOR_ROUNDOFF
    return FP32_ROUNDOFF


def reduction_tolerance(k: int, dtypes) -> float:
    """The check's bound for outputs that are sums of k products: 4 u_out + sqrt(k) u_acc.

    >>> from pytest_opperf.catalog.registry import DTypes
    >>> from pytest_opperf.dtypes import lookup
    >>> round(reduction_tolerance(4096, DTypes(lookup("bf16"), lookup("bf16"))), 6)   # 4/256 + 64/2^24
    0.015629
    """
    if not dtypes.output.is_float:
        return 0.0
    return 4 * unit_roundoff(dtypes.output) + math.sqrt(k) * accumulator_roundoff(dtypes.input)
