"""`supports` checks that many backends share: which dtypes a torch op (or a kernel written like one) computes in."""


def same_dtype(device_type, dt, capability):
    if dt.input != dt.output:
        return f"this torch op writes its input dtype, not {dt.output.name}"
    if not dt.input.is_float or dt.input.itemsize < 2:
        return f"{dt.input.name} is not a dtype this op computes in"
    return None


def reads_float_writes(op: str, out: str):
    """supports() of an op that reads fp32, fp16 or bf16 and writes the dtype named `out`
    (a quantizer's int8, a router's fp32 weights, a sampler's int64 ids)."""

    def supports(device_type, dt, capability):
        if dt.output.name != out:
            return f"{op} writes {out}, not {dt.output.name}: use dtypes {{input: bf16, output: {out}}}"
        if not dt.input.is_float or dt.input.itemsize < 2:
            return f"{op} reads fp32, fp16 or bf16, not {dt.input.name}"
        return None

    return supports
