#!/usr/bin/env bash
# Starts N processes of one command on this machine, joined by jax.distributed over loopback.
#
#   launch/local_multiprocess.sh 2 python -m pau_jax.launch --gin_file=quickstart.gin
#   LOCAL_DEVICES=4 launch/local_multiprocess.sh 2 python my_script.py   # 2 x 4 CPU devices
#
# Process i gets PAU_COORDINATOR_ADDRESS=127.0.0.1:$PORT, PAU_NUM_PROCESSES=N and
# PAU_PROCESS_ID=i, which pau_jax.parallel.initialize_distributed reads.
# Environment:
#   PORT           coordinator port (default: a free port chosen here)
#   LOCAL_DEVICES  fake CPU devices per process (default 1)
#   JAX_PLATFORMS  default cpu
# If one process fails, the others are stopped and its exit status is returned.
set -euo pipefail

if [[ $# -lt 2 || ! $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 NUM_PROCESSES COMMAND [ARGS...]" >&2
  exit 2
fi
num_processes=$1
shift
port=${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

pids=()
for ((i = 0; i < num_processes; i++)); do
  PAU_COORDINATOR_ADDRESS="127.0.0.1:${port}" \
  PAU_NUM_PROCESSES="${num_processes}" \
  PAU_PROCESS_ID="${i}" \
  JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}" \
  XLA_FLAGS="--xla_force_host_platform_device_count=${LOCAL_DEVICES:-1} ${XLA_FLAGS:-}" \
    "$@" &
  pids+=("$!")
done

remaining=${num_processes}
while ((remaining > 0)); do
  if wait -n; then
    remaining=$((remaining - 1))
  else
    status=$?
    echo "$0: a process exited with status ${status}; stopping the others" >&2
    kill "${pids[@]}" 2>/dev/null || true
    wait || true
    exit "${status}"
  fi
done
