#!/usr/bin/env bash
# Two (or N) real hosts on this box, as Linux network namespaces (lab_utils/launch/netns.py): each host has its own
# addresses and two interfaces, `data` (10.213.1.i/24, all hosts on one bridge) and `mgmt` (10.213.2.i/24, a link
# that reaches no other host). Needs root and iproute2 (`ip`). Chapter 09 and tests/launch/test_netns.py make them
# themselves; this script is for trying things by hand.
#
#   sudo scripts/two_hosts.sh up [N]   # make N hosts (default 2) and hold them until Ctrl-C / SIGTERM
#   sudo scripts/two_hosts.sh status   # the lab's hosts on this box and the processes in each
#   sudo scripts/two_hosts.sh down     # SIGTERM every `up` holder (it removes its hosts), then remove leftovers
#
# While `up` holds them, from another terminal (names as `up` printed them):
#   sudo ip netns exec l1234ah1 ip -br addr              # the host's interfaces
#   sudo ip netns exec l1234ah1 ip route get 10.213.1.2  # which interface reaches the peer: what
#                                                        # GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME should name
#   # one node per host; host 0 opens the store (is_host=1); each agent gives its own data address:
#   sudo ip netns exec l1234ah1 env GLOO_SOCKET_IFNAME=data .venv/bin/torchrun --nproc-per-node=1 --nnodes=2 \
#       --rdzv-backend=c10d --rdzv-endpoint=10.213.1.1:29400 --rdzv-id=by_hand --rdzv-conf=is_host=1 \
#       --local-addr=10.213.1.1 scripts/train.py steps=20 backend=gloo out_dir=runs/by_hand
#   sudo ip netns exec l1234ah2 env GLOO_SOCKET_IFNAME=data .venv/bin/torchrun --nproc-per-node=1 --nnodes=2 \
#       --rdzv-backend=c10d --rdzv-endpoint=10.213.1.1:29400 --rdzv-id=by_hand \
#       --local-addr=10.213.1.2 scripts/train.py steps=20 backend=gloo out_dir=runs/by_hand
# The namespaces share this box's files (the run folder is the same on both "hosts"), not its network.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
case "${1:-}" in
  up|down|status) exec "$PY" -m lab_utils.launch.netns "$@" ;;
  *) sed -n '2,25p' "$0"; exit 2 ;;
esac
