#!/usr/bin/env bash
# One GPU benchmark run (bench/gpu.py): filter, detection, dedup and JPEG decode on CUDA, our code
# paths against the bare models, on an offline machine. Run from anywhere:
#
#   bash bench/gpu.sh             # full sizes, on a CUDA machine (about 3-5 minutes on an H200)
#   bash bench/gpu.sh --smoke     # tiny sizes on whatever device there is (CPU: under 2 minutes)
#
# Wheels for what the machine lacks (ultralytics) travel in .whl/ at the repository root and are
# installed into /tmp/site without any index. Results go to $OUT/gpu.md and $OUT/gpu.json when
# $OUT is set.
set -u
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x .venv/bin/python ] && PYTHON=.venv/bin/python # a development checkout; not on the GPU machine
fi
if [ -d .whl ]; then
    if "$PYTHON" -m pip --version >/dev/null 2>&1; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
    else # no pip: a pure-python wheel unpacked is an installed package
        for wheel in .whl/*.whl; do "$PYTHON" -m zipfile -e "$wheel" /tmp/site; done
        export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
    fi
fi
export PYTHONPATH=.:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
# Nothing may reach for the network: ultralytics checks DNS at import, transformers the hub.
export YOLO_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export YOLO_CONFIG_DIR=${YOLO_CONFIG_DIR:-/tmp/yolo-config}
exec "$PYTHON" bench/gpu.py "$@"
