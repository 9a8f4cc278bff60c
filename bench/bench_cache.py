"""Memory per cached pod: the pod as the API server sends it (less managedFields) against what the
pod informer keeps (resourceconsist.cluster.transform), and the CPU each costs per watch event.

Each pod is decoded from its own watch event line, as the pod informer decodes it (the whole
pod by ``kube.decode_json``, a lean one by its transform's ``decode_event``), from a pod shaped like
one a Deployment makes on a real cluster (a service-account volume, env, probes, resources,
container statuses, the frame's gate, finalizers and annotation, managedFields); names, uids,
IPs and times differ from pod to pod. tracemalloc counts the bytes the stored pods hold.

The last row is a pod the cache drops (``--pod-label-selector``, docs/concepts.md "Pods the caches
keep"): the same pod without the label and the frame's marks, decoded and looked at, then let go.

Run: ``python bench/bench_cache.py [--pods 1000]``; docs/benchmarks.md explains the figures.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import time
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

from resourceconsist import wire
from resourceconsist.cluster.kube import KubeObject, decode_json
from resourceconsist.cluster.transform import FRAME_POD_FIELDS, keeping, keeping_selected_or_marked, trim
from resourceconsist.rules import lifecycle
from resourceconsist.rules.labels import parse_selector

SERVICE = "web"


def pod_json(i: int) -> str:
    """The JSON of pod ``i`` of the Deployment ``web``, Ready, guarded by its Service."""
    name = f"web-7d4b9c8f6d-{i:05d}"
    created = f"2026-11-24T05:{i // 60 % 60:02d}:{i % 60:02d}Z"
    gate = lifecycle.readiness_gate(SERVICE)
    key = lifecycle.expected_finalizer_key("Service", "shop", SERVICE)
    finalizer = f"{wire.LIFECYCLE_FINALIZER_PREFIX}/{SERVICE}"
    condition = {"status": "True", "lastProbeTime": None, "lastTransitionTime": created}
    pod: dict[str, Any] = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "generateName": "web-7d4b9c8f6d-",
            "namespace": "shop",
            "uid": str(uuid.UUID(int=i)),
            "resourceVersion": str(100000 + i),
            "creationTimestamp": created,
            "labels": {"app": SERVICE, "pod-template-hash": "7d4b9c8f6d", "tier": "frontend"},
            "annotations": {
                wire.AVAILABLE_CONDITIONS_ANNOTATION: json.dumps({"expectedFinalizers": {key: finalizer}}),
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-7d4b9c8f6d",
                    "uid": "5f0c3e9a-1b7d-4c59-9f43-2b8e1d6a7c10",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": [finalizer],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": created,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}}},
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": created,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:podIP": {}}},
                    "subresource": "status",
                },
            ],
        },
        "spec": {
            "volumes": [
                {
                    "name": f"kube-api-access-{i:05x}",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                        "defaultMode": 420,
                    },
                }
            ],
            "containers": [
                {
                    "name": "web",
                    "image": "registry.example.com/shop/web:1.42.0",
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": "LOG_LEVEL", "value": "info"}, {"name": "PORT", "value": "8080"}],
                    "resources": {
                        "limits": {"memory": "256Mi"},
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                    },
                    "volumeMounts": [
                        {
                            "name": f"kube-api-access-{i:05x}",
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                    "readinessProbe": {
                        "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                        "timeoutSeconds": 1,
                        "periodSeconds": 5,
                        "successThreshold": 1,
                        "failureThreshold": 3,
                    },
                    "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 35,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": f"node-{i % 20}",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "readinessGates": [{"conditionType": gate}],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, **condition}
                for t in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                    gate,
                )
            ],
            "hostIP": f"10.0.{i % 20}.1",
            "hostIPs": [{"ip": f"10.0.{i % 20}.1"}],
            "podIP": f"10.244.{i // 250}.{i % 250}",
            "podIPs": [{"ip": f"10.244.{i // 250}.{i % 250}"}],
            "startTime": created,
            "containerStatuses": [
                {
                    "name": "web",
                    "state": {"running": {"startedAt": created}},
                    "lastState": {},
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example.com/shop/web:1.42.0",
                    "imageID": "registry.example.com/shop/web@sha256:" + "0" * 64,
                    "containerID": f"containerd://{uuid.UUID(int=i).hex}{uuid.UUID(int=i).hex}",
                    "started": True,
                }
            ],
            "qosClass": "Burstable",
        },
    }
    return json.dumps(pod)


#: Decodes a watch event line to the object a cache stores, as the informer does.
Decode = Callable[[bytes], KubeObject]


def whole(line: bytes) -> KubeObject:
    return trim(decode_json(line)["object"])


def lean(paths: tuple[str, ...]) -> Decode:
    decode = keeping(paths).decode_event
    return lambda line: decode(line)["object"]  # type: ignore[no-any-return]


def event_line(text: str) -> bytes:
    return b'{"type":"MODIFIED","object":' + text.encode() + b"}"


def measure(decode: Decode, texts: list[bytes]) -> tuple[float, float]:
    """(bytes per stored pod, microseconds of decoding and keeping per pod)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    started = time.process_time()
    store = [decode(t) for t in texts]
    cpu = time.process_time() - started
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(store) == len(texts)
    return held / len(texts), cpu / len(texts) * 1e6


def unmarked(text: str) -> str:
    """The pod of ``text`` as an uncontrolled one: without finalizers, annotations, gates or labels."""
    pod = json.loads(text)
    for field in ("finalizers", "annotations", "labels"):
        pod["metadata"].pop(field, None)
    pod["spec"].pop("readinessGates", None)
    return json.dumps(pod)


def measure_dropped(decode: Decode, texts: list[bytes]) -> tuple[float, float]:
    """(bytes held, microseconds per pod) of pods that a cache keeping the controlled ones drops."""
    keeps = keeping_selected_or_marked(parse_selector(f"{wire.CONTROL_LABEL}={wire.CONTROL_LABEL_VALUE}"))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    started = time.process_time()
    # As the informer does: a pod it does not keep is let go once decoded.
    store = [o for o in (decode(t) for t in texts) if keeps(o)]
    cpu = time.process_time() - started
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert not store
    return held / len(texts), cpu / len(texts) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    args = parser.parse_args()
    texts = [pod_json(i) for i in range(args.pods)]
    print(f"{args.pods} pods of {sum(map(len, texts)) / len(texts) / 1024:.1f} KB of JSON each")
    lines = [event_line(t) for t in texts]
    rows = [
        ("whole (managedFields dropped)", whole),
        ("lean: the frame's fields", lean(FRAME_POD_FIELDS)),
        ("lean + spec.containers.ports (SLB)", lean((*FRAME_POD_FIELDS, "spec.containers.ports"))),
    ]
    # Untraced runs first, so every row pays the same warm-up (interned strings, allocator arenas).
    for _, decode in rows:
        [decode(t) for t in lines[:100]]
    figures = [(label, *measure(decode, copy.copy(lines))) for label, decode in rows]
    dropped = [event_line(unmarked(t)) for t in texts]
    figures.append(("dropped: unlabelled, unmarked", *measure_dropped(lean(FRAME_POD_FIELDS), dropped)))
    whole_bytes = figures[0][1]
    for label, per_pod, cpu_us in figures:
        share = per_pod / whole_bytes
        print(f"{label:<38} {per_pod / 1024:6.1f} KB/pod  ({share:4.2f})  {cpu_us:6.0f} µs/pod")


if __name__ == "__main__":
    main()
