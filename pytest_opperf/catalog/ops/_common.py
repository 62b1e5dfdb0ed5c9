"""What the elementwise and row-wise torch backends share."""


def same_dtype(device_type, dt, capability):
    if dt.input != dt.output:
        return f"this torch op writes its input dtype, not {dt.output.name}"
    if not dt.input.is_float or dt.input.itemsize < 2:
        return f"{dt.input.name} is not a dtype this op computes in"
    return None
