# Shared by scripts/test and scripts/demo: checks (and as root installs) what lowbit
# builds with, then configures and builds. Source it; do not run it.
set -euo pipefail

LOWBIT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

# Debian/Ubuntu packages lowbit needs beyond the CUDA Toolkit and NCCL. zlib1g-dev: the
# tests read gzipped traces (test/ refuses to configure without zlib).
LOWBIT_APT_PACKAGES=(cmake g++ make catch2 nlohmann-json3-dev libbenchmark-dev
                     libopenmpi-dev openmpi-bin zlib1g-dev)

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

find_nvcc() {
  command -v nvcc 2>/dev/null && return
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    [[ -x $d/nvcc ]] && { echo "$d/nvcc"; return; }
  done
  return 1
}

find_nccl() {
  local d
  for d in ${NCCL_ROOT:-} ${NCCL_HOME:-} /usr /usr/local /usr/local/cuda; do
    [[ -n $d && -f $d/include/nccl.h ]] && { echo "$d"; return; }
  done
  return 1
}

ensure_deps() {
  local missing=()
  if command -v dpkg-query >/dev/null; then
    for p in "${LOWBIT_APT_PACKAGES[@]}"; do have_pkg "$p" || missing+=("$p"); done
  fi
  if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      say "installing: ${missing[*]}"
      export DEBIAN_FRONTEND=noninteractive
      apt-get install -y -q "${missing[@]}" >/dev/null ||
        { apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
    else
      echo "lowbit needs these packages; install them and run again:" >&2
      echo "  sudo apt-get install ${missing[*]}" >&2
      exit 1
    fi
  fi
  NVCC=$(find_nvcc) || {
    echo "nvcc not found: install the CUDA Toolkit (https://developer.nvidia.com/cuda-downloads)" \
         "or put its bin/ on PATH" >&2
    exit 1
  }
  export PATH=$(dirname "$NVCC"):$PATH
  find_nccl >/dev/null || {
    echo "NCCL not found: install libnccl-dev (NVIDIA's CUDA apt repository) or set NCCL_ROOT" >&2
    exit 1
  }
}

has_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

# configure_build <build-dir> [cmake args...]
# LOWBIT_CMAKE_ARGS (environment, space-separated) adds arguments to every configure,
# e.g. LOWBIT_CMAKE_ARGS="-DLOWBIT_TEST_DIRS=core;codec" for a quick subset.
configure_build() {
  local dir=$1
  shift
  local prefix=() extra=()
  [[ -d $LOWBIT_ROOT/.deps/usr ]] && prefix=(-DCMAKE_PREFIX_PATH="$LOWBIT_ROOT/.deps/usr")
  read -r -a extra <<<"${LOWBIT_CMAKE_ARGS:-}"
  # the caller's arguments first: LOWBIT_CMAKE_ARGS, the person's own, override them
  cmake -S "$LOWBIT_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "${prefix[@]}" \
    "$@" "${extra[@]}" >/dev/null
  cmake --build "$dir" -j "$JOBS"
}
