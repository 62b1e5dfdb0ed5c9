"""Rounding of the dtypes, and the check's bounds built on it: one for elementwise ops, one for
reductions (GEMMs, attention, norms).

The unit roundoff u of a float dtype is half its machine epsilon: round-to-nearest puts every
result within a relative u of the exact one (fp32 2^-24, tf32 and fp16 2^-11, bf16 2^-8,
fp8 e4m3 2^-4).

The check's measure is the normwise relative error against the float64 reference, so the bounds
are in units of u of the output dtype. A correct kernel computes in fp32 and rounds its output
once (within u; about 0.3-0.6 u normwise on random data), or twice when it keeps an
intermediate in the output dtype (silu(x) * y in bf16): measured on CPU (torch 2.13) every
catalogue op's torch backend lands at 0.35-0.94 u_out at bf16 and fp16. A kernel wrong by 1%
reads 2.56 u_bf16 (10 u_fp16), so the bound must stay under that: 2 u_out, for elementwise ops.

A dot product of length k accumulated one term after the other in precision u_acc has a
normwise relative error of about sqrt(k/6) * u_acc on random data (each addition rounds a
partial sum whose size grows like sqrt(j); the k errors are independent), so sqrt(k) * u_acc
bounds it with room. Hence, for a reduction of length k:

    tolerance = 2 * u_out + sqrt(k) * u_acc

u_acc is the accumulator's roundoff, not the input's: tensor cores and CPU BLAS multiply fp16,
bf16 and fp32 inputs exactly and add in fp32 (2^-24); Hopper's fp8 tensor cores keep about 14
bits while they add (DeepSeek-V3 technical report, arXiv:2412.19437, section 3.3.2), so fp8
inputs take 2^-14. Measured on random inputs (CPU, torch 2.13): a bf16 GEMM lands at 0.43 u_out
for every k from 64 to 16384, and one accumulated in bf16 itself at about 0.3 sqrt(k) u_bf16
(0.037 at k = 1024): a bound of sqrt(k) * u_in would let such a kernel, or one 10% off, pass.
Integer GEMMs are exact: their bound is 0.

No bound of an op that takes exp, erf or rsqrt goes under LIBRARY_FLOOR (1e-4, only fp32 and
fp64 outputs reach it; a GEMM's fp32 bound stays k-based, a few 1e-6): GPU libraries
compute fp32 exp, erf and rsqrt with approximations a few units of 2^-24 off (CUDA's fast
intrinsics, Triton's libdevice), which a bound of 2 u_fp32 would fail; 1e-4 still fails a 1%
error a hundred times over.
"""

from __future__ import annotations

import math

# Hopper's fp8 tensor-core accumulator keeps about 14 bits (DeepSeek-V3 report, 3.3.2).
FP8_ACCUMULATOR_ROUNDOFF = 2.0**-14
FP32_ROUNDOFF = 2.0**-24
# The smallest bound: fp32 library approximations of exp/erf/rsqrt stay under it (see above).
LIBRARY_FLOOR = 1e-4
# A correct kernel's output within this many u of its dtype (normwise); 1% is 2.56 u_bf16.
OUTPUT_ULPS = 2.0


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


def elementwise_tolerance(dtypes, ulps: float = OUTPUT_ULPS) -> float:
    """The check's bound for an op whose every output element is a short formula of a few input
    elements (add, gelu, rope, a norm's scaling): `ulps` u_out, at least LIBRARY_FLOOR; 0 for
    integer outputs (compared exactly anyway).

    >>> from pytest_opperf.catalog.registry import DTypes
    >>> from pytest_opperf.dtypes import lookup
    >>> bf16, fp32 = DTypes(lookup("bf16"), lookup("bf16")), DTypes(lookup("fp32"), lookup("fp32"))
    >>> elementwise_tolerance(bf16) == 2 * 2**-8, elementwise_tolerance(fp32)
    (True, 0.0001)
    """
    if not dtypes.output.is_float:
        return 0.0
    return max(ulps * unit_roundoff(dtypes.output), LIBRARY_FLOOR)


def reduction_tolerance(k: int, dtypes, transcendental: bool = False) -> float:
    """The check's bound for outputs that are sums of k products: 2 u_out + sqrt(k) u_acc; at
    least LIBRARY_FLOOR for an op that also takes exp or rsqrt (softmax, attention, norms).

    >>> from pytest_opperf.catalog.registry import DTypes
    >>> from pytest_opperf.dtypes import lookup
    >>> round(reduction_tolerance(4096, DTypes(lookup("bf16"), lookup("bf16"))), 6)   # 2/256 + 64/2^24
    0.007816
    """
    if not dtypes.output.is_float:
        return 0.0
    bound = OUTPUT_ULPS * unit_roundoff(dtypes.output) + math.sqrt(k) * accumulator_roundoff(dtypes.input)
    return max(bound, LIBRARY_FLOOR) if transcendental else bound
