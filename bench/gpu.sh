#!/usr/bin/env bash
# One GPU benchmark run (bench/gpu.py): filter, detection, dedup and JPEG decode on CUDA, our code
# paths against the bare models, on an offline machine. Run from anywhere:
#
#   bash bench/gpu.sh             # full sizes, on a CUDA machine (about 3-5 minutes on an H200)
#   bash bench/gpu.sh --smoke     # tiny sizes on whatever device there is (CPU: under 2 minutes)
#   bash bench/gpu.sh --dry-run   # on the CPU, under a minute: checks that the script is complete
#                                 # (sections, full-size architectures, report, wheels); exit 1 if not
#
# Wheels for what the machine lacks (ultralytics, faiss-cpu) travel in .whl/ at the repository
# root (or the folder $WHEELS names) and are installed into /tmp/site without any index; a dry run
# installs them into a temporary folder and checks that they import from there. Fetch them once:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#       ultralytics==8.4.190 faiss-cpu==1.15.1
# Results go to $OUT/gpu.md and $OUT/gpu.json when $OUT is set.
set -u
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x .venv/bin/python ] && PYTHON=.venv/bin/python # a development checkout; not on the GPU machine
fi
WHEELS=${WHEELS:-.whl}
SITE=/tmp/site
case " $* " in
*" --dry-run "*) # a throwaway install, removed however the script ends
    SITE=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bench-site.XXXXXX")
    trap 'rm -rf "$SITE"' EXIT
    ;;
esac
install_wheels() {
    if "$PYTHON" -m pip --version >/dev/null 2>&1; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$WHEELS"/*.whl
    else # no pip: a pure-python wheel unpacked is an installed package
        for wheel in "$WHEELS"/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$SITE" || return 1; done
    fi
}
if [ -d "$WHEELS" ]; then
    if install_wheels; then
        echo "wheels: $(ls "$WHEELS"/*.whl | wc -l) from $WHEELS installed into $SITE"
    else
        echo "wheels: $WHEELS/*.whl could not be installed into $SITE" # the dry run fails on it
    fi
    export PYTHONPATH=$SITE:${PYTHONPATH:-} GPU_BENCH_SITE=$SITE
fi
export PYTHONPATH=.:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
# Nothing may reach for the network: ultralytics checks DNS at import, transformers the hub.
export YOLO_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export YOLO_CONFIG_DIR=${YOLO_CONFIG_DIR:-/tmp/yolo-config}
"$PYTHON" bench/gpu.py "$@"
