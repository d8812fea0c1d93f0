#!/usr/bin/env bash
# Runs the same command on every worker of a Cloud TPU pod slice; each worker is one JAX process.
#
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a launch/tpu_pod.sh \
#       python -m pau_jax.launch --gin_file=aac.gin --gin_file=mesh/fsdp8.gin
#
# Environment:
#   TPU_NAME   the TPU VM (required)
#   ZONE       its zone (required)
#   PROJECT    Google Cloud project (default: gcloud's configured project)
#   REPO_DIR   checkout of pau_jax on every worker (default: pau_jax in the home directory)
#   VENV       virtual environment to activate on the workers (optional)
# The workers find each other through the TPU metadata: PAU_DISTRIBUTED=auto makes
# pau_jax.parallel.initialize_distributed call jax.distributed.initialize() without arguments.
# Copy the code to the workers first, e.g. with
#   gcloud compute tpus tpu-vm scp --recurse . "$TPU_NAME":pau_jax --zone="$ZONE" --worker=all
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME to the TPU VM name}"
: "${ZONE:?set ZONE to the TPU VM zone}"
if [[ $# -lt 1 ]]; then
  echo "usage: TPU_NAME=... ZONE=... $0 COMMAND [ARGS...]" >&2
  exit 2
fi

command=$(printf '%q ' "$@")
setup="cd ${REPO_DIR:-pau_jax}"
if [[ -n "${VENV:-}" ]]; then
  setup="${setup} && source ${VENV}/bin/activate"
fi

gcloud compute tpus tpu-vm ssh "${TPU_NAME}" \
  --zone="${ZONE}" \
  ${PROJECT:+--project="${PROJECT}"} \
  --worker=all \
  --command="${setup} && PAU_DISTRIBUTED=auto ${command}"
