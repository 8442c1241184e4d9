#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One lab host as a node of its own for the Prometheus lab test. Run by `netlab.sh exec`, it
# enters a new mount and UTS namespace, gives the host its own /dev/shm and host name, serves
# `vigil export --all-users` on LISTEN as the vigil-exporter service does (its stderr in LOG),
# and runs the command (a rank) in front. The exporter is ended by its PID when the command
# ends; the command's status is the script's.
#   usage: lab_host.sh HOSTNAME LISTEN VIGIL_BIN LOG -- CMD [ARGS...]
set -euo pipefail
if [[ -z ${VIGIL_LAB_HOST_NS:-} ]]; then # never touch the real /dev/shm: own namespaces first
    VIGIL_LAB_HOST_NS=1 exec unshare --mount --uts --propagation private -- "$0" "$@"
fi
unset VIGIL_LAB_HOST_NS
name=$1 listen=$2 vigil=$3 log=$4
shift 4
[[ ${1:-} == -- ]] && shift
mount -t tmpfs -o mode=1777,size=512m tmpfs /dev/shm
hostname "$name"
"$vigil" export --listen "$listen" --all-users 2>"$log" &
exporter=$!
trap 'kill "$exporter" 2>/dev/null || true; wait "$exporter" 2>/dev/null || true' EXIT
rc=0
"$@" || rc=$?
exit "$rc"
