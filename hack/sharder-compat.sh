#!/usr/bin/env bash
# Compatibility run against the real sharder of kubernetes-controller-sharding (docs/scaling.md,
# "Compatibility with kubernetes-controller-sharding"). Not in CI: it needs that project's sources.
#
#   SHARDER_SRC=/path/to/kubernetes-controller-sharding hack/sharder-compat.sh
#
# Builds its sharder (cmd/sharder) from SHARDER_SRC, starts a local control plane (the testing
# kit's etcd + kube-apiserver), applies its CRDs and a ControllerRing for Services, starts the
# sharder (its webhook served on 127.0.0.1 with a throw-away certificate), then SHARDS replicas of
# ours with `--sharding --no-sharder`, and checks that every controlled Service carries exactly one
# shard label, the one our ring places it on, no drain label, and that every pod it selects is
# served (guarded by its lifecycle finalizer); that a Service created then is assigned in the
# create by the sharder's webhook. Then it SIGKILLs shard-0 and checks the same among the others,
# the dead shard's Lease taken over by the sharder, and a pod created after the kill in each of the
# dead shard's Services guarded; then SIGTERMs shard-1 likewise (its Lease released). Exit 0 when
# each holds within TIMEOUT seconds.
#
# Knobs: RING (resourceconsist), SHARDS (3), SERVICES (12), PODS (3 per Service), TIMEOUT (180 per
# check), KILL (1; 0: no SIGKILL and SIGTERM phases), PYTHON (the worktree's .venv/bin/python). The sharder's
# webhook listens on :9443 (not configurable in its SharderConfig), so that port must be free.
# Logs stay in the printed work directory.
set -euo pipefail

if [[ -z "${SHARDER_SRC:-}" ]]; then
  echo "error: SHARDER_SRC is not set: point it at a git checkout of" \
    "github.com/timebertt/kubernetes-controller-sharding (v0.11 or later, ControllerRing naming)," \
    "e.g. SHARDER_SRC=~/src/kubernetes-controller-sharding hack/sharder-compat.sh" >&2
  exit 2
fi
if [[ ! -d "$SHARDER_SRC/cmd/sharder" || ! -d "$SHARDER_SRC/config/crds" ]]; then
  echo "error: $SHARDER_SRC has no cmd/sharder or config/crds: is it a kubernetes-controller-sharding" \
    "checkout of v0.11 or later?" >&2
  exit 2
fi
for tool in go kubectl openssl; do
  command -v "$tool" >/dev/null || { echo "error: $tool is needed on PATH" >&2; exit 1; }
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
ring="${RING:-resourceconsist}" shards="${SHARDS:-3}" services="${SERVICES:-12}" pods="${PODS:-3}"
timeout="${TIMEOUT:-180}" kill="${KILL:-1}" ns="sharder-compat"
work="$(mktemp -d -t sharder-compat.XXXXXX)"
pids=()
cleanup() {
  # Last started, first stopped: the shards and the sharder still reach the API server on their
  # way out (releasing their Leases).
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  echo "logs in $work"
}
trap cleanup EXIT
free_port() { "$py" -c 'from resourceconsist.testing.controlplane import free_port; print(free_port())'; }

echo "building the sharder from $SHARDER_SRC"
(cd "$SHARDER_SRC" && CGO_ENABLED=0 nice -n 10 go build -o "$work/sharder" ./cmd/sharder)

echo "starting a local control plane"
"$py" - "$work/kubeconfig-path" >"$work/controlplane.log" 2>&1 <<'EOF' &
import signal, sys
from pathlib import Path
from resourceconsist.testing import LocalControlPlane

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
cp = LocalControlPlane()
cp.start()
Path(sys.argv[1]).write_text(str(cp.kubeconfig))
signal.sigwait({signal.SIGTERM, signal.SIGINT})
cp.stop()
EOF
pids+=($!)
for _ in $(seq 120); do [[ -s "$work/kubeconfig-path" ]] && break; sleep 0.5; done
[[ -s "$work/kubeconfig-path" ]] || { echo "error: no control plane; see $work/controlplane.log" >&2; exit 1; }
export KUBECONFIG="$(cat "$work/kubeconfig-path")"

kubectl apply --server-side -k "$SHARDER_SRC/config/crds" >/dev/null
kubectl wait --for condition=established --timeout=60s crd/controllerrings.sharding.timebertt.dev >/dev/null

# The API server calls the sharder's webhook on 127.0.0.1:9443 (its server's default port).
mkdir -p "$work/certs"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
  -keyout "$work/certs/tls.key" -out "$work/certs/tls.crt" 2>/dev/null
cat >"$work/sharder.yaml" <<EOF
apiVersion: config.sharding.timebertt.dev/v1alpha1
kind: SharderConfig
# Health off; metrics on a free loopback port: "0" does not turn its metrics server off (it then
# binds :8080).
health: {bindAddress: "0"}
metrics: {bindAddress: "127.0.0.1:$(free_port)"}
controller: {sharder: {syncPeriod: 30s}}
webhook:
  server: {certDir: "$work/certs"}
  config:
    clientConfig:
      url: https://127.0.0.1:9443/
      caBundle: $(base64 -w0 "$work/certs/tls.crt")
EOF
"$work/sharder" --config "$work/sharder.yaml" >"$work/sharder.log" 2>&1 &
pids+=($!)

kubectl apply -f - >/dev/null <<EOF
apiVersion: sharding.timebertt.dev/v1alpha1
kind: ControllerRing
metadata: {name: $ring}
spec:
  resources:
  - group: ""
    resource: services
  namespaceSelector:
    matchLabels: {kubernetes.io/metadata.name: $ns}
EOF

echo "creating $services Services x $pods Ready pods in $ns"
PYTHONPATH="$root/bench" "$py" - "$ns" "$services" "$pods" <<'EOF'
import os, sys
from bench_pace import populate, set_ready
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.testing import Cluster

ns, services, pods = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = KubeClient.from_kubeconfig(os.environ["KUBECONFIG"])
for name in populate(client, ns, services, pods):
    set_ready(client, Cluster(client, ns), name, True)
EOF

# What the run checks, twice: every Service carries exactly the shard label our ring places it on
# among the live shards (the Go sharder's rule, docs/scaling.md "Placement"), no drain label, and
# every pod it selects is guarded by its lifecycle finalizer. After the SIGKILL it also waits for
# the real sharder to have taken the dead shard's Lease over, and for a pod created after the kill
# in each Service the dead shard held to be guarded: a live shard serves that Service.
cat >"$work/check.py" <<'PYEOF'
import os, sys, time
from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.rules import lifecycle
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.runtime.sharding.ring import HashRing, drain_label, hash_key, shard_label
from resourceconsist.testing import finalizers

ns, ring, live, timeout = sys.argv[1], sys.argv[2], sys.argv[3].split(","), float(sys.argv[4])
# "shard=holder": that shard's Lease must be held by holder (empty: released, or deleted).
gone, _, holder_wanted = (sys.argv[5] if len(sys.argv) > 5 else "").partition("=")
client = KubeClient.from_kubeconfig(os.environ["KUBECONFIG"])
placement = HashRing(live)
# Timed from SINCE (seconds since the epoch: the replicas' start, or the kill).
began = float(os.environ.get("SINCE") or time.time())


def problems() -> list[str]:
    found = []
    for svc in client.list(kube.SERVICE, ns)["items"]:
        name, labels = svc["metadata"]["name"], svc["metadata"].get("labels") or {}
        want = placement.shard_of(hash_key("v1", "Service", ns, name))
        shard_keys = [k for k in labels if k.startswith(wire.SHARD_LABEL_PREFIX)]
        if shard_keys != [shard_label(ring)] or labels[shard_label(ring)] != want:
            found.append(f"{name}: shard labels {({k: labels[k] for k in shard_keys})}, want {want}")
        if drain_label(ring) in labels:
            found.append(f"{name}: still draining")
        pods = client.list(kube.POD, ns, label_selector=f"app={name}")["items"]
        unguarded = [p["metadata"]["name"] for p in pods if lifecycle.lifecycle_finalizer(name) not in finalizers(p)]
        if unguarded:
            found.append(f"{name}: pods not served {unguarded}")
    if gone:
        lease = client.get_or_none(kube.LEASE, ns, gone) or {}
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        if holder != holder_wanted:
            found.append(f"Lease {gone}: held by {holder!r}, want {holder_wanted!r}")
    return found


deadline = began + timeout
while (left := problems()) and time.time() < deadline:
    time.sleep(0.5)
if left:
    print("FAIL: not within %.0f s:\n  " % timeout + "\n  ".join(left), file=sys.stderr)
    sys.exit(1)
print(f"OK {time.time() - began:.1f} s after {'the stop of ' + gone if gone else 'the start'}: every Service of {ns} carries one shard label,"
      f" the ring's choice among {live}, no drain label, and every pod it selects is guarded"
      + (f"; {gone}'s Lease is held by {holder_wanted!r}" if gone else ""))
PYEOF

echo "starting $shards replicas with --sharding --no-sharder"
started="$(date +%s.%N)" shard_pids=()
for k in $(seq 0 $((shards - 1))); do
  "$py" -m resourceconsist run --adapter demo --kubeconfig "$KUBECONFIG" --namespace "$ns" \
    --sharding --no-sharder --controller-ring "$ring" --shard-name "shard-$k" \
    --leader-election-namespace "$ns" --metrics-bind-address 0 \
    --health-probe-bind-address "127.0.0.1:$(free_port)" \
    >"$work/shard-$k.log" 2>&1 &
  pids+=($!) shard_pids+=($!)
done
SINCE="$started" "$py" "$work/check.py" "$ns" "$ring" "$(seq -s, -f 'shard-%g' 0 $((shards - 1)))" "$timeout"

# A Service created now is assigned by the sharder's webhook in the create itself (the moves above
# went through it on update): the object the API server answers with carries the ring's choice.
"$py" - "$ns" "$ring" "$(seq -s, -f 'shard-%g' 0 $((shards - 1)))" "svc-$(printf %03d "$services")" <<'PYEOF'
import os, sys
from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.runtime.sharding.ring import HashRing, hash_key, shard_label

ns, ring, live, name = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
client = KubeClient.from_kubeconfig(os.environ["KUBECONFIG"])
body = {
    "metadata": {"name": name, "labels": {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}},
    "spec": {"selector": {"app": name}, "ports": [{"port": 80}]},
}
created = client.create(kube.SERVICE, ns, body)
got = (created["metadata"].get("labels") or {}).get(shard_label(ring))
want = HashRing(live).shard_of(hash_key("v1", "Service", ns, name))
if got != want:
    sys.exit(f"FAIL: {name} was created with shard label {got!r}, want {want!r} (the sharder's webhook)")
print(f"OK: {name} was created carrying shard label {got}, the ring's choice")
PYEOF

[[ "$kill" == 1 && "$shards" -gt 1 ]] || exit 0
held_by() {
  kubectl get services -n "$ns" -l "shard.alpha.sharding.timebertt.dev/$ring=$1" -o jsonpath='{.items[*].metadata.name}'
}
# A new Ready pod named <Service>-<suffix> in each Service named, created once the stopped shard's
# process is gone: guarded only if a live shard serves that Service after the stop (the older
# pods were guarded before it).
new_pods() {
  local suffix="$1" octet="$2" svc ip
  shift 2
  for svc in "$@"; do
    kubectl create -n "$ns" -f - >/dev/null <<PODEOF
{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "$svc-${suffix,,}", "labels": {"app": "$svc"}},
 "spec": {"containers": [{"name": "c", "image": "x"}]}}
PODEOF
    ip="10.250.$octet.$((10#${svc#svc-} + 1))"
    kubectl patch pod -n "$ns" "$svc-${suffix,,}" --subresource status --type merge -p \
      "{\"status\": {\"podIP\": \"$ip\", \"podIPs\": [{\"ip\": \"$ip\"}], \"conditions\": [{\"type\": \"Ready\", \"status\": \"True\"}]}}" >/dev/null
  done
}

# Stop shard-K with a signal, once its process is gone give each Service it held a new Ready pod,
# and check among the shards after it that the sharder moved them and they are served, and that
# K's Lease is held by the holder named (empty: released).
stop_shard() {
  local signal="$1" k="$2" holder="$3" held since
  held="$(held_by "shard-$k")"
  echo "SIG$signal to shard-$k (it held: ${held:-nothing}); a new Ready pod in each of those"
  since="$(date +%s.%N)"
  kill "-$signal" "${shard_pids[k]}"
  wait "${shard_pids[k]}" 2>/dev/null || true
  # shellcheck disable=SC2086 # the Service names, split on purpose
  new_pods "$signal" $((k + 1)) $held
  SINCE="$since" "$py" "$work/check.py" "$ns" "$ring" "$(seq -s, -f 'shard-%g' $((k + 1)) $((shards - 1)))" \
    "$timeout" "shard-$k=$holder"
}

# SIGKILL: the Lease is left to expire; the sharder takes it over once it has been expired for a
# lease duration more, and moves the dead shard's Services to the others.
stop_shard KILL 0 shardlease-controller
[[ "$shards" -gt 2 ]] || exit 0
# SIGTERM: the shard ends its passes and releases its Lease, which the sharder sees as dead at
# once; it moves the Services without waiting for an expiry.
stop_shard TERM 1 ""
