#!/usr/bin/env bash
# Build AVSG with its NPU backend on an Ascend machine (Atlas A2/A3, CANN toolkit + torch_npu).
#
#   scripts/build_npu.sh [--soc Ascend910B3] [--install] [--test]
#
# What it does
#   1. finds CANN: $ASCEND_HOME_PATH if set, else the usual install roots; sources its set_env.sh
#      (ASCEND_HOME_PATH, compiler and runtime paths, LD_LIBRARY_PATH);
#   2. checks that the Python in PATH imports torch and torch_npu, and that their versions pair;
#   3. picks the SoC: --soc, else $AVSG_SOC_VERSION, else `npu-smi info` (e.g. 910B3 ->
#      Ascend910B3), else Ascend910B3;
#   4. builds through setup.py, i.e. the top-level CMakeLists, which always builds the CPU backend
#      (_C*.so) and, because ASCEND_HOME_PATH is set, op_host/npu: ascendc_library(avsg_kernels)
#      over every op_kernel/*.cpp and the PrivateUse1 op library python/avsg/_npu_ops.so.
#      AVSG_REQUIRE_NPU=1 turns any NPU configure problem into an error instead of a warning.
#      Default: `python setup.py build_ext --inplace`; --install: `pip install --no-build-isolation -e .`
#   5. --test: the first things to run on a new Ascend machine: `avsg doctor` (versions, the
#      host-register call chosen, an AI-core read of registered host memory, a self-test against
#      the reference), then tests/npu/test_npu*.py (which skip, with the reason, when no NPU is
#      visible). Both go into a report file, npu_report_<host>_<date>.txt (or $AVSG_NPU_REPORT),
#      to attach to an issue; the script exits non-zero when either fails.
#
# Environment: ASCEND_HOME_PATH, AVSG_SOC_VERSION, TORCH_NPU_PATH (skip the torch_npu import probe),
# PYTHON (default: python3).
#
# Using the result: `import avsg` loads the CPU backend; `import avsg.backend` (or
# avsg.backend.load_npu_backend()) imports torch_npu and loads _npu_ops.so. Host KV pools read by
# the NPU gather must be registered once: avsg.backend.register_host_pool(pool).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
soc="${AVSG_SOC_VERSION:-}"
install=0
run_tests=0
while [ $# -gt 0 ]; do
    case "$1" in
        --soc) soc="$2"; shift 2 ;;
        --soc=*) soc="${1#--soc=}"; shift ;;
        --install) install=1; shift ;;
        --test) run_tests=1; shift ;;
        -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
        *) echo "build_npu.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

die() { echo "build_npu.sh: $*" >&2; exit 1; }

# ---- 1. CANN -------------------------------------------------------------------------------
if [ -z "${ASCEND_HOME_PATH:-}" ]; then
    for root in /usr/local/Ascend/ascend-toolkit/latest /usr/local/Ascend/cann "$HOME/Ascend/ascend-toolkit/latest"; do
        if [ -d "$root" ]; then ASCEND_HOME_PATH="$root"; break; fi
    done
fi
[ -n "${ASCEND_HOME_PATH:-}" ] && [ -d "$ASCEND_HOME_PATH" ] \
    || die "CANN not found: set ASCEND_HOME_PATH to the toolkit (e.g. /usr/local/Ascend/ascend-toolkit/latest)"
env_script=""
for cand in "$ASCEND_HOME_PATH/set_env.sh" "$ASCEND_HOME_PATH/../set_env.sh" "$ASCEND_HOME_PATH/bin/setenv.bash"; do
    if [ -f "$cand" ]; then env_script="$cand"; break; fi
done
if [ -n "$env_script" ]; then
    echo "build_npu.sh: sourcing $env_script"
    keep_home="$ASCEND_HOME_PATH"
    set +u  # vendor scripts read unset variables
    # shellcheck disable=SC1090
    source "$env_script"
    set -u
    export ASCEND_HOME_PATH="${ASCEND_HOME_PATH:-$keep_home}"
else
    echo "build_npu.sh: warning: no set_env.sh next to $ASCEND_HOME_PATH; using the environment as is" >&2
    export ASCEND_HOME_PATH
fi
found_cmake=""
# The same candidates as avsg_find_ascendc_cmake (op_host/npu/avsg_build.cmake).
for d in compiler/tikcpp/ascendc_kernel_cmake tools/tikcpp/ascendc_kernel_cmake ascendc_devkit/tikcpp/samples/cmake \
         "$(uname -m)-linux/tikcpp/ascendc_kernel_cmake" $(cd "$ASCEND_HOME_PATH" && ls -d ./*-linux/tikcpp/ascendc_kernel_cmake 2>/dev/null | sort); do
    if [ -f "$ASCEND_HOME_PATH/$d/ascendc.cmake" ]; then found_cmake="$ASCEND_HOME_PATH/$d"; break; fi
done
[ -n "$found_cmake" ] || die "ascendc.cmake not found under $ASCEND_HOME_PATH (CANN toolkit incomplete?)"
echo "build_npu.sh: CANN at $ASCEND_HOME_PATH (ascendc.cmake in $found_cmake)"

# ---- 2. torch + torch_npu --------------------------------------------------------------------
"$PYTHON" -c "import torch" 2>/dev/null || die "$PYTHON cannot import torch"
if [ -z "${TORCH_NPU_PATH:-}" ]; then
    TORCH_NPU_PATH="$("$PYTHON" -c 'import os, torch_npu; print(os.path.dirname(torch_npu.__file__))' 2>/dev/null)" \
        || die "$PYTHON cannot import torch_npu (pip install torch-npu matching torch $("$PYTHON" -c 'import torch; print(torch.__version__)'))"
fi
export TORCH_NPU_PATH
"$PYTHON" - <<'EOF'
import torch, torch_npu
t, n = torch.__version__.split("+")[0], torch_npu.__version__.split("+")[0].split(".post")[0]
print(f"build_npu.sh: torch {torch.__version__}, torch_npu {torch_npu.__version__}")
if t.split(".")[:2] != n.split(".")[:2]:
    print(f"build_npu.sh: warning: torch {t} and torch_npu {n} look mismatched", flush=True)
EOF

# ---- 3. SoC ------------------------------------------------------------------------------------
if [ -z "$soc" ] && command -v npu-smi >/dev/null 2>&1; then
    chip="$(npu-smi info 2>/dev/null | grep -oE '910B[1-4]|910_93[0-9]+' | head -n1 || true)"
    if [ -n "$chip" ]; then soc="Ascend$chip"; fi
fi
soc="${soc:-Ascend910B3}"
export AVSG_SOC_VERSION="$soc"
export AVSG_REQUIRE_NPU=1
echo "build_npu.sh: SoC $AVSG_SOC_VERSION"

# ---- 4. build ----------------------------------------------------------------------------------
cd "$here"
rm -rf build/temp*/cmake/CMakeCache.txt  # re-read SOC_VERSION / paths on every run
if [ "$install" = 1 ]; then
    "$PYTHON" -m pip install --no-build-isolation -e .
else
    "$PYTHON" setup.py build_ext --inplace
fi
lib="$(ls python/avsg/_npu_ops*.so 2>/dev/null | head -n1 || true)"
[ -n "$lib" ] || die "the build finished without python/avsg/_npu_ops.so (see the CMake output above)"
echo "build_npu.sh: built $lib"
# a library built with the split plan's config launch needs its kernel binary next to it
if grep -aq 'AVSG_NPU_SPLIT_LAUNCH=batch' "$lib"; then
    [ -f python/avsg/avsg_plan_split.o ] || die "$lib launches split plans from python/avsg/avsg_plan_split.o, which the build did not make (see the CMake output above)"
fi
"$PYTHON" -c "import sys; sys.path.insert(0, 'python'); import avsg.backend as b; print('build_npu.sh: backend', b.backend_info())"

# ---- 5. tests ----------------------------------------------------------------------------------
if [ "$run_tests" = 1 ]; then
    report="${AVSG_NPU_REPORT:-$here/npu_report_$(hostname -s 2>/dev/null || echo host)_$(date +%Y%m%d_%H%M%S).txt}"
    export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
    {
        echo "# AVSG NPU report: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -a)"
        echo "# commit: $(git -C "$here" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$here" diff --quiet 2>/dev/null || echo ' (modified)')"
        echo "# SoC: $AVSG_SOC_VERSION, CANN: $ASCEND_HOME_PATH"
        if command -v npu-smi >/dev/null 2>&1; then echo "## npu-smi info"; npu-smi info 2>&1 || true; fi
    } > "$report"
    status=0
    echo "## avsg doctor" | tee -a "$report"
    "$PYTHON" -m avsg.cli doctor 2>&1 | tee -a "$report" || status=1   # pipefail: doctor's status
    echo "## pytest tests/npu/test_npu*.py" | tee -a "$report"
    "$PYTHON" -m pytest -q -rs -p no:cacheprovider tests/npu/test_npu*.py 2>&1 | tee -a "$report" || status=1
    echo "build_npu.sh: report written to $report (attach it to an issue)"
    exit "$status"
fi
