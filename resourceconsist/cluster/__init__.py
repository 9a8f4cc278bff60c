"""Kubernetes I/O: the client (``kube``) and its event-loop transport (``aiokube``), kubeconfig and
in-cluster configuration (``kubeconfig``), informer caches (``cache``) and what they keep of an
object (``transform``), Events (``events``), the small I/O protocols the reconcile steps take
(``interfaces``), and X.509 certificates (``certs``)."""
