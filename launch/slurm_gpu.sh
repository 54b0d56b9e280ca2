#!/usr/bin/env bash
# Multi-node GPU run of one visim_jax command under SLURM: one process per node, each driving all its GPUs.
#
#   sbatch --nodes=4 --gpus-per-node=8 launch/slurm_gpu.sh --config=configs/tll.py --workdir=/shared/runs/tll
#   VISIM_VENV=/shared/venvs/visim sbatch --nodes=2 launch/slurm_gpu.sh --config=configs/demo.py --workdir=/shared/w
#
# The arguments of this script are passed to `python -m visim_jax.main` unchanged. Before srun starts the
# tasks, the first node of the allocation becomes the JAX coordinator; each task then exports
#   JAX_COORDINATOR_ADDRESS=<first node>:$VISIM_PORT  JAX_NUM_PROCESSES=$SLURM_NTASKS  JAX_PROCESS_ID=$SLURM_PROCID
# and visim_jax.training.distributed.maybe_initialize() passes them to jax.distributed.initialize(). Only process 0
# writes metrics, plots and config.json; --workdir and the data must be on a file system every node sees.
# Install first, on the shared file system: python -m venv $VISIM_VENV && $VISIM_VENV/bin/pip install "jax[cuda12]" ./
#SBATCH --job-name=visim_jax
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --time=04:00:00
#SBATCH --output=visim_%j.out
set -euo pipefail

if [[ $# -eq 0 ]]; then
  echo "slurm_gpu.sh: give the visim_jax.main arguments, e.g. --config=configs/tll.py --workdir=/shared/w" >&2
  exit 2
fi
: "${SLURM_JOB_NODELIST:?slurm_gpu.sh must run inside a SLURM allocation (sbatch or salloc)}"

if [[ -n "${VISIM_VENV:-}" ]]; then
  # shellcheck disable=SC1091
  source "$VISIM_VENV/bin/activate"
fi
REPO=${VISIM_REPO:-${SLURM_SUBMIT_DIR:-$(pwd)}}
COORDINATOR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export VISIM_COORDINATOR="$COORDINATOR:${VISIM_PORT:-12355}"
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
echo "visim_jax: $SLURM_NNODES nodes x ${SLURM_GPUS_PER_NODE:-?} GPUs, coordinator $VISIM_COORDINATOR"

# Single quotes: SLURM_PROCID and SLURM_NTASKS are expanded by each task, not here.
srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c '
  export JAX_COORDINATOR_ADDRESS="$VISIM_COORDINATOR"
  export JAX_NUM_PROCESSES="$SLURM_NTASKS"
  export JAX_PROCESS_ID="$SLURM_PROCID"
  cd "$0" && exec python -m visim_jax.main "$@"' "$REPO" "$@"
