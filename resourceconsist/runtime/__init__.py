"""What a process runs: the ``manager`` wiring controllers, leader election, health and metrics;
each ``controller`` with its ``workqueue`` and event ``handler``s; ``leaderelection``;
``metrics`` and who may read them (``metricsauth``); member clusters (``multicluster``); the
process's log format (``logs``); and what version runs (``version``)
(docs/concepts.md, "The runtime")."""
