#!/usr/bin/env bash
# The collectives' multi_gpu checks on a 2-GPU machine, each under a timeout (an NCCL
# hang costs seconds, not the session): the nccl_comm, collective, agreement and
# hierarchical tests, then the
# MPI+NCCL example at 2/4/8 bits beside ncclAllReduce in the NVLink and PCIe-class
# regimes. Binaries come from $BIN (prebuilt) or are built into $BUILD. Logs to $OUT.
#   BIN=build-coll/gpu-bin OUT=/tmp/out test/collective/run_multi_gpu.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-$root/multi-gpu-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --allow-run-as-root --oversubscribe -np 2)
bin=${BIN:-}
if [[ -z $bin ]] || ! "$bin/collective_nccl_test" --list-tests >/dev/null 2>&1; then
  build=${BUILD:-$root/build-mgpu}
  echo "building into $build"
  timeout 200 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$root/.deps/usr" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLOWBIT_BUILD_TOOLS=OFF -DLOWBIT_BUILD_BENCHMARKS=OFF \
    "-DLOWBIT_TEST_DIRS=comm;collective" >"$out/configure.log" 2>&1
  timeout 300 cmake --build "$build" -j "$(nproc)" --target comm_nccl_test collective_nccl_test \
    collective_nccl_agreement_test collective_nccl_hierarchical_test mpi_nccl_allreduce \
    >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  bin=$out/bin
  mkdir -p "$bin"
  cp "$build"/test/comm/comm_nccl_test "$build"/test/collective/collective_nccl_test \
    "$build"/test/collective/collective_nccl_agreement_test \
    "$build"/test/collective/collective_nccl_hierarchical_test \
    "$build"/examples/mpi_nccl_allreduce "$bin"/
fi
nvidia-smi -L
for t in comm_nccl_test collective_nccl_test collective_nccl_agreement_test \
  collective_nccl_hierarchical_test; do
  timeout ${TEST_TIMEOUT:-150} "${mpirun[@]}" "$bin/$t" >"$out/$t.log" 2>&1
  echo "$t: rc=$? $(grep -aE 'test cases|All tests passed' "$out/$t.log" | tail -1)"
  grep -aE -A4 'FAILED' "$out/$t.log" | head -40
done
count=${COUNT:-67108864}
for regime in nvlink pcie; do
  env=()
  [[ $regime == pcie ]] && env=(env NCCL_P2P_DISABLE=1)
  bits_list=${BITS_LIST:-4 2 8}
  [[ $regime == pcie ]] && bits_list=${PCIE_BITS_LIST:-4}
  for b in $bits_list; do
    echo "--- $regime, $b bits, $count floats"
    timeout 60 "${env[@]}" "${mpirun[@]}" "$bin/mpi_nccl_allreduce" --bits "$b" --count "$count" \
      --iters 20 2>&1 | grep -v "^$" | tail -6
  done
done
