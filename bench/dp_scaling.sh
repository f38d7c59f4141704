#!/bin/bash
# Data-parallel scaling on this machine: 1 rank x 1 thread against N ranks x 1 thread at the same
# global batch, for the mlp (784-1024-1024-10, batch 512) and the cnn 420/1000 (batch 64), with
# rank 0's JSON per run and the samples/s ratio. The machine's load changes the figures: run it idle.
# usage: bench/dp_scaling.sh [BUILD_DIR] [RANKS]
set -eu
build=${1:-build-cpu} ranks=${2:-2}
# (nproc before OMP_NUM_THREADS is set: GNU nproc honours it)
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for spec in "mlp 512 20 3" "cnn 64 3 1"; do
  read -r model batch steps warmup <<<"$spec"
  args=(--model "$model" --batch "$batch" --steps "$steps" --warmup "$warmup")
  one=$("$build/dp_bench" "${args[@]}")
  many=$(mpirun -np "$ranks" --oversubscribe --bind-to none -x OMP_NUM_THREADS "$build/dp_bench" "${args[@]}")
  echo "$one"
  echo "$many"
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  # An exposed wait longer than the whole all-reduce is rank skew (one rank's backward still
  # running while the other waits), not communication: said so instead of a negative share.
  python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); \
e, w = b['exposed_wait_ms'], b['no_overlap_wait_ms']; \
hidden = f'{100*b[\"hidden_fraction\"]:.0f}%' if e <= w else 'n/a (rank skew: the wait exceeds the whole all-reduce)'; \
print(f\"$model: {b['world_size']} ranks / 1 rank = {b['samples_per_s']/a['samples_per_s']:.2f}x samples/s; \
all-reduce hidden behind backward: {hidden} (exposed wait {e:.1f} ms of {w:.1f} ms per step)\")" "$one" "$many"
done
