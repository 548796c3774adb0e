#!/usr/bin/env bash
# The GPU image path (issue 34) on a machine with a GPU, as ONE command from the repository root:
#
#     bash benchmarks/gpu_run.sh            # writes env.json, tests.log, gpu_decode.json, bench.log to $OUT
#
# It runs the JPEG device path's tests (the CUDA one included) and benchmarks/gpu_decode.py: pipekit's CPU
# path vs its device path (nvJPEG) vs DALI's GPU pipeline, images/s and GPU busy % of a ResNet-50 step at
# batch 256.  It ends inside ~9 minutes (each step under `timeout`), for a 10-minute device call.
#
# The device machine has no package index and a python3 with torch, torchvision, numpy, pillow, fsspec, tqdm
# and pytest(-timeout).  Wheels to carry (in .whl/, named in the call's `carry`; fetch them here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl torchdata==0.11.0
# after `echo /.whl/ >> .git/info/exclude`):
#   - torchdata==0.11.0 (pure Python, ~60 kB): pipekit's only dependency missing from that image (required).
#   - nvidia-dali-cuda130 (DALI 2.x) for the DALI cell: its wheel is several hundred MB, over the 64 MiB a
#     device call carries, so it cannot travel; where `import nvidia.dali` fails the DALI cell is skipped
#     and the report says so (skipped.dali).  A machine with DALI installed runs it as is.
#
# Device call:  run(command="bash benchmarks/gpu_run.sh", carry=[".whl"], timeout_s=590)
set -uo pipefail
OUT=${OUT:-/tmp/pipekit-gpu-run}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "installing the carried wheels failed"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}

timeout 60 "$PY" - >"$OUT/env.json" <<'EOF'
import json, os, platform, torch, torchvision
try:
    import nvidia.dali as dali
    dali_version = dali.__version__
except ImportError as exc:
    dali_version = f"missing: {exc}"
print(json.dumps({
    "platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
    "torch": torch.__version__, "torchvision": torchvision.__version__, "cuda": torch.version.cuda,
    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "dali": dali_version,
    "load": os.getloadavg(),
}, indent=2))
EOF
cat "$OUT/env.json"

# the device path's tests, the CUDA test included (no conftest: its fixtures need packages the image lacks)
timeout 180 "$PY" -m pytest tests/test_jpeg_device.py tests/test_device.py -q -p no:cacheprovider --noconftest \
    -o addopts="" --timeout 120 -rs 2>&1 | tee "$OUT/tests.log"

# the benchmark: 8,192 JPEGs of 320x256 in 16 shards, batches of 256, 0 and 8 workers, 3 rounds
# (BENCH_ARGS=--quick: the small run that proves it works, e.g. on a CPU)
BENCH_ARGS=${BENCH_ARGS:---samples 8192 --shards 16 --batch 256 --workers 0,8 --repeats 3}
# shellcheck disable=SC2086
timeout 420 "$PY" benchmarks/gpu_decode.py $BENCH_ARGS --json "$OUT/gpu_decode.json" 2>&1 | tee "$OUT/bench.log"
ls -l "$OUT"
