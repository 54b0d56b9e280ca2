#!/usr/bin/env bash
# Run one visim_jax command on every worker of a Cloud TPU VM (a single host or a multi-host pod slice).
#
#   launch/tpu_pod.sh [--name=visim-v4] [--zone=us-central2-b] [--accelerator=v4-32] [--version=tpu-ubuntu2204-base] \
#                     [--project=MY_PROJECT] [--spot] [--no_install] -- --config=configs/tll.py --workdir=/mnt/shared/run1 ...
#
# What it does:
#   1. creates the TPU VM NAME (or reuses it if it already exists, whatever its accelerator);
#   2. copies this checkout (git archive of HEAD + uncommitted tracked changes) to every worker and installs it
#      with `pip install "jax[tpu]" ./visim_jax` (skip with --no_install once it is installed);
#   3. runs `VISIM_DISTRIBUTED=1 python -m visim_jax.main ARGS` on every worker at once (--worker=all):
#      visim_jax.training.distributed.maybe_initialize() then calls jax.distributed.initialize(), which finds the
#      other workers through the TPU metadata; only process 0 writes metrics, plots and config.json.
# Everything after `--` is passed to visim_jax.main unchanged. Data and --workdir must be readable/writable
# from every worker (e.g. a Filestore/NFS mount or a gcsfuse-mounted bucket at the same path on every worker). Delete the VM yourself when done:
#   gcloud compute tpus tpu-vm delete NAME --zone=ZONE
set -euo pipefail

NAME=${TPU_NAME:-visim}
ZONE=${TPU_ZONE:-us-central2-b}
ACCELERATOR=${TPU_ACCELERATOR:-v4-8}
VERSION=${TPU_VERSION:-tpu-ubuntu2204-base}
PROJECT=${CLOUDSDK_CORE_PROJECT:-}
SPOT=""
INSTALL=1
DRY_RUN=${DRY_RUN:-0}   # DRY_RUN=1 prints the gcloud commands instead of running them

while [[ $# -gt 0 ]]; do
  case "$1" in
    --name=*) NAME="${1#*=}" ;;
    --zone=*) ZONE="${1#*=}" ;;
    --accelerator=*) ACCELERATOR="${1#*=}" ;;
    --version=*) VERSION="${1#*=}" ;;
    --project=*) PROJECT="${1#*=}" ;;
    --spot) SPOT="--spot" ;;
    --no_install) INSTALL=0 ;;
    --) shift; break ;;
    *) echo "tpu_pod.sh: unknown option $1 (put visim_jax.main arguments after --)" >&2; exit 2 ;;
  esac
  shift
done
if [[ $# -eq 0 ]]; then
  echo "tpu_pod.sh: give the visim_jax.main arguments after --, e.g. -- --config=configs/demo.py --workdir=/tmp/w" >&2
  exit 2
fi

run() { if [[ "$DRY_RUN" == 1 ]]; then printf '+'; printf ' %q' "$@"; echo; else "$@"; fi; }
GC=(gcloud compute tpus tpu-vm)
COMMON=(--zone="$ZONE")
[[ -n "$PROJECT" ]] && COMMON+=(--project="$PROJECT")

# 1. create or reuse
if [[ "$DRY_RUN" != 1 ]] && "${GC[@]}" describe "$NAME" "${COMMON[@]}" >/dev/null 2>&1; then
  echo "reusing TPU VM $NAME in $ZONE"
else
  run "${GC[@]}" create "$NAME" "${COMMON[@]}" --accelerator-type="$ACCELERATOR" --version="$VERSION" $SPOT
fi

# 2. ship this checkout and install it on every worker
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARGS=$(printf '%q ' "$@")
if [[ "$INSTALL" == 1 ]]; then
  TARBALL=$(mktemp -t visim_jax-XXXXXX.tar.gz)
  STASH=$(git -C "$REPO" stash create || true)   # HEAD plus uncommitted tracked changes, without touching the tree
  git -C "$REPO" archive --format=tar.gz --prefix=visim_jax/ -o "$TARBALL" "${STASH:-HEAD}"
  run "${GC[@]}" scp "$TARBALL" "$NAME":visim_jax.tar.gz --worker=all "${COMMON[@]}"
  run "${GC[@]}" ssh "$NAME" --worker=all "${COMMON[@]}" --command="set -e; rm -rf visim_jax; \
    tar xzf visim_jax.tar.gz; python3 -m pip install -q -U pip; \
    python3 -m pip install -q 'jax[tpu]' -f https://storage.googleapis.com/jax-releases/libtpu_releases.html; \
    python3 -m pip install -q ./visim_jax"
  rm -f "$TARBALL"
fi

# 3. the same command on every worker
run "${GC[@]}" ssh "$NAME" --worker=all "${COMMON[@]}" \
  --command="cd visim_jax && VISIM_DISTRIBUTED=1 python3 -m visim_jax.main $ARGS"
