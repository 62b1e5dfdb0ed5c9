"""The functional check: a backend's output against the op's reference, before any timing.

The measure is the normwise relative error ||out - ref|| / ||ref|| (in float64), which
does not blow up on elements near zero the way an elementwise rtol does, plus exact
checks of shape, dtype and finiteness. Its bound comes from the op's numerics
(catalog/precision.py).

A second measure catches what is systematic: the share of the reference the error carries,
<out - ref, ref> / <ref, ref> (1.01 for an output scaled by 1.01: 0.01). Rounding errors are
as often up as down and project to about normwise / sqrt(n); a wrong scale, slope or
normalisation projects whole. Its bound is one unit roundoff of the output dtype (at least
SYSTEMATIC_FLOOR) plus four times that random share, so a kernel 1% off fails even where the
normwise bound must be loose (an eager backend that rounds attention scores to bf16).

An op with several outputs returns a tuple. An output whose reference is an integer tensor
(token or expert ids, offsets, quantized values) is compared exactly and must have the
reference's dtype. A float output is compared normwise: the first in the case's output dtype,
a further one in it too when its reference is float64, else in the dtype its reference comes
in (a quantizer's float32 scales).

**Detection floor.** examine() also says how small a systematic error the check surely
catches on the case: the smallest e such that an output (1 + e) times the one that passed, of
either sign, fails. It comes from the passing output's own errors: normwise eps, share s, n
elements, unit roundoff u of the output dtype, eps' = eps + u for the rounding of the scaled
output, normwise bound B:

    normwise:   |e| > (B + eps') / (1 - eps')
    systematic: |e| > (max(u, SYSTEMATIC_FLOOR) + 4 eps' / sqrt(n) + |s|) / (1 + s - 4 (1 + eps') / sqrt(n))

(||o' - r|| >= |e| ||o|| - ||o - r|| - u ||o'|| and ||o|| >= ||r|| (1 - eps); the share of o'
is s + e (1 + s), against its bound at the scaled output's largest error). The floor is the
smaller, the largest over a case's float outputs; an output compared exactly adds none. A
passing output's |s| is within its systematic bound, so a wrong kernel that passes cannot
claim a floor much under twice that bound. Correct kernels: a bf16 output of 1024 elements
about 0.5%, fp32 0.01-0.02%; an fp8 output over 12% (its steps are 6-12%); a bf16 output of a
few dozen elements over 1%, where rounding and a scale error cannot be told apart. Views flag
a floor above 1% (docs/timing.md, "The check's detection floor").
"""

from __future__ import annotations

import math
from typing import Any, Optional

from pytest_opperf import dtypes
from pytest_opperf.dtypes import check_chunk

# The systematic share a correct fp32 kernel may carry: library approximations of exp/erf
# (catalog/precision.py's LIBRARY_FLOOR).
SYSTEMATIC_FLOOR = 1e-4
# Elements compared at a time: the check's own memory is two float64 chunks (256 MiB), whatever
# the output's size (a 1 GiB all_gather over 8 ranks gathers 8 GiB: a whole float64 copy is 32 GiB).
# OPPERF_CHECK_CHUNK sets another (the tests check the chunking on small outputs with it).
CHUNK = check_chunk()


def compare(out: Any, ref: Any, dtype_out, max_rel_err: float) -> Optional[str]:
    """None if `out` matches `ref`, else a message saying how it does not."""
    return examine(out, ref, dtype_out, max_rel_err)[0]


def examine(out: Any, ref: Any, dtype_out, max_rel_err: float) -> tuple[Optional[str], Optional[float]]:
    """(None if `out` matches `ref`, else a message saying how it does not; the check's detection
    floor on this case, relative: see the module's doc. 0 when every output was compared exactly
    (integers, indices: any wrong element fails); None when the output did not match)."""
    import torch

    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    if len(outs) != len(refs):
        return f"backend returned {len(outs)} outputs, the reference {len(refs)}", None
    floors = []  # an output compared exactly adds 0: a wrong element of it fails whatever its size
    for i, (o, r) in enumerate(zip(outs, refs)):
        where = f"output {i}: " if len(outs) > 1 else ""
        if not isinstance(o, torch.Tensor):
            return f"{where}backend returned {type(o).__name__}, expected a tensor", None
        if tuple(o.shape) != tuple(r.shape):
            return f"{where}shape {tuple(o.shape)}, expected {tuple(r.shape)}", None
        if not (r.dtype.is_floating_point or r.dtype.is_complex):
            problem = _compare_exact(o, r)
            if problem:
                return where + problem, None
            floors.append(0.0)
            continue
        if i > 0 and r.dtype != torch.float64:
            if o.dtype != r.dtype:
                return f"{where}dtype {o.dtype}, expected {r.dtype} (the reference's dtype for this output)", None
        elif o.dtype != dtype_out.torch:
            return f"{where}dtype {o.dtype}, expected {dtype_out.torch} ({dtype_out.name})", None
        bad, diff, scale, along = _sums(o.detach(), r.detach())
        if bad:
            return f"{where}{int(bad)} of {o.numel()} elements are NaN or infinite", None
        err = diff / scale if scale > 0 else diff
        if not err <= max_rel_err:
            worst, got, want = _largest_difference(o.detach(), r.detach())
            return (f"{where}normwise relative error {err:.3g} exceeds {max_rel_err:g} "
                    f"(largest difference at flat index {worst}: {got:.6g} vs reference {want:.6g})"), None
        problem = _systematic(along / scale**2, err, o) if scale > 0 else None
        if problem:
            return where + problem, None
        if scale > 0 and o.dtype.is_floating_point:
            floors.append(detection_floor(err, along / scale**2, o.numel(), torch.finfo(o.dtype).eps / 2,
                                          max_rel_err))
        elif max_rel_err == 0:  # integers that must match exactly (an int8 GEMM's int32 sums): floor 0
            floors.append(0.0)
    return None, max(floors) if floors else None


def detection_floor(err: float, share: float, n: int, u: float, bound: float) -> float:
    """The smallest scale error e that the check surely catches, relative to an output whose own
    normwise error is `err` and systematic share `share` (n elements, unit roundoff u, normwise
    `bound`): the module doc's two conditions, the smaller; inf where neither can be met.

    A correct bf16 output of 1024 elements (err 0.2%, share 0; u = 2^-8, bound 2u): eps' = 0.0059,
    normwise (0.0078 + 0.0059) / 0.9941 = 1.38%, systematic (0.0039 + 4 * 0.0059 / 32) /
    (1 - 4 * 1.0059 / 32) = 0.53%:

    >>> round(detection_floor(0.002, 0.0, 1024, 2**-8, 2**-7), 4)
    0.0053
    >>> round(detection_floor(0.002, 0.0, 64, 2**-8, 2**-7), 4)  # 64 elements: over 1%
    0.0138
    """
    eps = err + u
    normwise = (bound + eps) / (1 - eps) if eps < 1 else math.inf
    root = math.sqrt(n)
    room = 1 + share - 4 * (1 + eps) / root
    systematic = (max(u, SYSTEMATIC_FLOOR) + 4 * eps / root + abs(share)) / room if room > 0 else math.inf
    return min(normwise, systematic)


def _sums(o, r) -> list[float]:
    """[non-finite elements, ||o - r||, ||r||, <o - r, r>] in float64, a chunk of CHUNK elements at
    a time, with one sync for all four. Finiteness is read in the output's own dtype (a cast keeps
    NaN and infinity as they are), but for 1-byte floats, which have no isfinite kernel everywhere."""
    import torch

    flat_o, flat_r = o.reshape(-1), r.reshape(-1)
    total = torch.zeros(4, dtype=torch.float64, device=o.device)
    for start in range(0, flat_o.numel(), CHUNK):
        oc = flat_o[start:start + CHUNK]
        r64 = flat_r[start:start + CHUNK].to(o.device, torch.float64)
        d64 = oc.to(torch.float64, copy=True)  # a copy even of a float64 output: it is subtracted from
        bad = (~torch.isfinite(d64 if o.dtype.itemsize == 1 else oc)).sum()
        d64.sub_(r64)
        total += torch.stack([bad.double(), d64.square().sum(), r64.square().sum(), torch.dot(d64, r64)])
    bad, diff2, scale2, along = total.tolist()
    return [bad, diff2 ** 0.5, scale2 ** 0.5, along]


def _largest_difference(o, r) -> tuple[int, float, float]:
    """(flat index, output value, reference value) of the largest absolute difference, by chunks."""
    import torch

    flat_o, flat_r = o.reshape(-1), r.reshape(-1)
    best = (-1.0, 0, 0.0, 0.0)
    for start in range(0, flat_o.numel(), CHUNK):
        oc = flat_o[start:start + CHUNK].double()
        rc = flat_r[start:start + CHUNK].to(o.device, torch.float64)
        k = int((oc - rc).abs().argmax().item())
        gap = abs(oc[k].item() - rc[k].item())
        if gap > best[0]:
            best = (gap, start + k, oc[k].item(), rc[k].item())
    return best[1], best[2], best[3]


def _systematic(share: float, err: float, o) -> Optional[str]:
    """Why an output's error is systematic beyond its dtype's rounding (see the module's doc), or None."""
    import torch

    if not o.dtype.is_floating_point:  # int8 q against a float reference: its rounding is absolute, not relative
        return None
    u = torch.finfo(o.dtype).eps / 2
    bound = max(u, SYSTEMATIC_FLOOR) + 4 * err / o.numel() ** 0.5
    if abs(share) <= bound:
        return None
    return (f"systematic error: the output is {1 + share:.4f}x the reference along it (more than {bound:.3g} "
            f"off 1x, where rounding gives about {err / o.numel() ** 0.5:.2g})")


class LastReference:
    """The reference output of the last case checked, with its inputs, for the next case on equal
    inputs: another backend or knob setting of the same shape (they share inputs: Case.inputs_key).

    A hit needs the same key and inputs equal bit for bit to the kept ones as they are now (a
    backend that wrote into its inputs while it was timed changed them: a miss). Kept only up to
    MAX_BYTES of inputs and output, and let go (release) before the inputs of another key are
    made, so that two cases' inputs are alive together only where they can be shared.
    """

    MAX_BYTES = 2 << 30

    def __init__(self) -> None:
        self.key: Optional[str] = None
        self.args: tuple = ()
        self.ref: Any = None

    def get(self, key: str, args: tuple) -> Any:
        """The kept reference for these inputs, or None."""
        if key != self.key or not same_values(args, self.args):
            return None
        return self.ref

    def keep(self, key: str, args: tuple, ref: Any) -> None:
        self.release()
        if _nbytes(args) + _nbytes(ref if isinstance(ref, (tuple, list)) else (ref,)) <= self.MAX_BYTES:
            self.key, self.args, self.ref = key, args, ref

    def release(self, unless: Optional[str] = None) -> None:
        """Let the kept tensors go, unless they are kept for `unless`."""
        if unless is None or unless != self.key:
            self.key, self.args, self.ref = None, (), None


def _nbytes(values) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def same_values(args: tuple, others: tuple) -> bool:
    """Do two argument tuples hold the same values: tensors bit for bit, the rest equal?

    Cheap next to a reference: one comparison kernel per tensor, none for the same tensor.
    Bits, not ==: fp8 has no equality kernel on every device, and a copy is a copy of bits.
    """
    import torch

    if len(args) != len(others):
        return False
    for a, b in zip(args, others):
        if a is b:
            continue
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
                return False
            if not torch.equal(_bits(a), _bits(b)):
                return False
        elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or not _equal(a, b):
            return False
    return True


def fingerprint(out: Any) -> Optional[tuple]:
    """The integer sum of each output tensor's bits: whether a kept output still holds what was
    checked (a backend may write its later outputs into a buffer an earlier one lives in).
    None for outputs that are not tensors. One pass over each, one sync.

    >>> import torch; fingerprint((torch.tensor([1, 2], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)))
    (3, 3)
    """
    import torch

    outs = out if isinstance(out, (tuple, list)) else (out,)
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        return None
    try:
        sums = [_bits(o.detach()).sum(dtype=torch.int64).to(outs[0].device) for o in outs]
    except (RuntimeError, TypeError):  # no integer view of this dtype (complex128): no fingerprint, no shortcut
        return None
    return tuple(int(v) for v in torch.stack(sums).tolist())


def same_output(out: Any, earlier: Any, inputs: tuple) -> bool:
    """Is `out` bit for bit `earlier`, in tensors of their own? Then a check of `out` against the
    reference `earlier` passed would pass the same way, and one comparison kernel replaces it.

    Tensors that share memory with each other or with an input prove nothing (an output buffer
    the op reuses, an in-place op whose input the timing changed since): False, so the caller
    compares with the reference.
    """
    import torch

    outs = out if isinstance(out, (tuple, list)) else (out,)
    earlier = earlier if isinstance(earlier, (tuple, list)) else (earlier,)
    if len(outs) != len(earlier) or not outs:
        return False
    held = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    for a, b in zip(outs, earlier):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        pa, pb = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
        if pa == pb or pa in held or pb in held:
            return False
        held.update((pa, pb))
    return same_values(tuple(outs), tuple(earlier))


def _bits(t):
    as_int = dtypes.of_itemsize(t.element_size())
    return t.view(as_int.torch) if as_int is not None and t.dtype != as_int.torch else t


def _equal(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a == b that is not a truth value (an array): not provably equal
        return False


def _compare_exact(o, r) -> Optional[str]:
    if o.dtype != r.dtype:
        return f"dtype {o.dtype}, expected {r.dtype} (the reference's: ids are compared exactly)"
    differ = (o != r.to(o.device)).flatten()
    count = int(differ.sum().item())
    if not count:
        return None
    first = int(differ.nonzero()[0].item())
    return (f"{count} of {o.numel()} elements differ from the reference (first at flat index {first}: "
            f"{o.flatten()[first].item()} vs {r.flatten()[first].item()})")
