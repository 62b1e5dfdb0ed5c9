# Sourced by the GPU acceptance scripts, from the checkout's root with $OUT set: NVLink multicast
# off (the device machines' rule), the wheels of ../shared/device/wheels.sh from .whl/ (carry
# [".whl"]), and this package installed, so `pytest` and pytester's sessions load the plugin by
# its entry point as on a user's machine. Not a script of its own.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || cat "$OUT/install.log"
