"""What a process runs: the ``manager`` wiring controllers, leader election, health and metrics;
each ``controller`` with its ``workqueue`` and event ``handler``s; ``leaderelection``;
``metrics``; member clusters (``multicluster``); and the process's log format (``logs``)
(docs/concepts.md, "The runtime")."""
