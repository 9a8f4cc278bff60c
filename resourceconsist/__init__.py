"""resourceconsist: keep external resources consistent with Kubernetes employers and employees."""
