"""Pure rules, no I/O: the provider ``diff``, PodOpsLifecycle's annotation and finalizers
(``lifecycle``), what a pod's ``marks`` say about the employers holding it, the readiness
``gates``, and label selectors (``labels``)."""
