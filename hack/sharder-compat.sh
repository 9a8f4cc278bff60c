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
# served (guarded by its lifecycle finalizer). Exit 0 when all holds within TIMEOUT seconds.
#
# Knobs: RING (resourceconsist), SHARDS (3), SERVICES (12), PODS (3 per Service), TIMEOUT (180),
# PYTHON (the worktree's .venv/bin/python). Logs stay in the printed work directory.
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
timeout="${TIMEOUT:-180}" ns="sharder-compat"
work="$(mktemp -d -t sharder-compat.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "logs in $work"
}
trap cleanup EXIT

echo "building the sharder from $SHARDER_SRC"
(cd "$SHARDER_SRC" && CGO_ENABLED=0 go build -o "$work/sharder" ./cmd/sharder)

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
health: {bindAddress: "0"}
metrics: {bindAddress: "0"}
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
from resourceconsist.kube import KubeClient
from resourceconsist.testing import Cluster

ns, services, pods = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = KubeClient.from_kubeconfig(os.environ["KUBECONFIG"])
for name in populate(client, ns, services, pods):
    set_ready(client, Cluster(client, ns), name, True)
EOF

echo "starting $shards replicas with --sharding --no-sharder"
for k in $(seq 0 $((shards - 1))); do
  "$py" -m resourceconsist run --adapter demo --kubeconfig "$KUBECONFIG" --namespace "$ns" \
    --sharding --no-sharder --controller-ring "$ring" --shard-name "shard-$k" \
    --leader-election-namespace "$ns" --metrics-bind-address 0 \
    --health-probe-bind-address "127.0.0.1:$("$py" -c 'from resourceconsist.testing.controlplane import free_port; print(free_port())')" \
    >"$work/shard-$k.log" 2>&1 &
  pids+=($!)
done

# Every Service: exactly the shard label our ring places it on (the Go sharder's rule,
# docs/scaling.md "Placement"), no drain label, every pod it selects guarded.
"$py" - "$ns" "$ring" "$shards" "$timeout" <<'EOF'
import os, sys, time
from resourceconsist import kube, lifecycle
from resourceconsist.kube import KubeClient
from resourceconsist.sharding.ring import HashRing, drain_label, hash_key, shard_label
from resourceconsist.testing import finalizers

ns, ring, shards, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
client = KubeClient.from_kubeconfig(os.environ["KUBECONFIG"])
placement = HashRing({f"shard-{k}" for k in range(shards)})


def problems() -> list[str]:
    found = []
    for svc in client.list(kube.SERVICE, ns)["items"]:
        name, labels = svc["metadata"]["name"], svc["metadata"].get("labels") or {}
        want = placement.shard_of(hash_key("v1", "Service", ns, name))
        shard_keys = [k for k in labels if k.startswith("shard.alpha.sharding.timebertt.dev/")]
        if shard_keys != [shard_label(ring)] or labels[shard_label(ring)] != want:
            found.append(f"{name}: shard labels {({k: labels[k] for k in shard_keys})}, want {want}")
        if drain_label(ring) in labels:
            found.append(f"{name}: still draining")
        pods = client.list(kube.POD, ns, label_selector=f"app={name}")["items"]
        unguarded = [p["metadata"]["name"] for p in pods if lifecycle.lifecycle_finalizer(name) not in finalizers(p)]
        if unguarded:
            found.append(f"{name}: pods not served {unguarded}")
    return found


deadline = time.monotonic() + timeout
while (left := problems()) and time.monotonic() < deadline:
    time.sleep(1)
if left:
    print("FAIL: not within %.0f s:\n  " % timeout + "\n  ".join(left), file=sys.stderr)
    sys.exit(1)
print(f"OK: every Service of {ns} carries one shard label, the ring's choice among {shards} shards, and is served")
EOF
