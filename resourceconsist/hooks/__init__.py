"""What runs beside a controller, through its narrow ``handle``: the garbage pass (``orphans``),
employer-owned ``subresources`` and the lifecycle ``subscribers`` (docs/lifecycle-hooks.md)."""
