# Shell helpers shared by gpunet's scripts: messages, waiting on a URL.
# Source it; it defines functions only.

gn_die() {
  echo "gpunet: $*" >&2
  exit 1
}

gn_note() {
  echo "gpunet: $*" >&2
}

# gn_wait_http URL TIMEOUT_S: waits until URL answers any HTTP status.
gn_wait_http() {
  local url=$1 limit=$2 i
  for ((i = 0; i < limit * 10; i++)); do
    if curl -s -o /dev/null --max-time 1 "$url"; then
      return 0
    fi
    sleep 0.1
  done
  return 1
}
