#!/usr/bin/env bash
# Hardware smoke test of the verbs backend between two hosts with RDMA NICs.
#
#   host A:  bench/verbs-smoke.sh server 192.168.7.5
#   host B:  bench/verbs-smoke.sh client 192.168.7.5 192.168.7.6
#
# Builds lnd-bench with the `verbs` feature (needs the packages listed in docs/verbs.md), then
# A serves and B runs brw write and read (1 MiB, 8 in flight, every byte checked) and a ping.
# TCP port 987 (the CM side channel) must be open between the hosts. Exit status 0 = passed.
set -euo pipefail
cd "$(dirname "$0")/.."

role=${1:?usage: verbs-smoke.sh server SERVER_IP | client SERVER_IP CLIENT_IP}
server_ip=${2:?server IP address (IPv4 address of the NIC on host A)}
net=${NET:-o2ib}
tunables=${TUNABLES:-conf/ko2iblnd.conf}

case "$role" in
server | client) ;;
*)
  echo "unknown role '$role' (server or client)" >&2
  exit 2
  ;;
esac

cargo build --release -p lnd-bench --features verbs
bench=target/release/lnd-bench

case "$role" in
server)
  echo "serving on ${server_ip}@${net}; stop with Ctrl-C"
  exec "$bench" server --fabric verbs --nid "${server_ip}@${net}" --tunables "$tunables"
  ;;
client)
  client_ip=${3:?client IP address (IPv4 address of the NIC on host B)}
  common=(--fabric verbs --nid "${client_ip}@${net}" --to "${server_ip}@${net}" --tunables "$tunables")
  "$bench" ping "${common[@]}" --size 8 --duration 5
  "$bench" brw "${common[@]}" --op write --size 1M --concurrency 8 --check full --duration 10
  "$bench" brw "${common[@]}" --op read --size 1M --concurrency 8 --check full --duration 10
  echo "verbs smoke test passed"
  ;;
esac
