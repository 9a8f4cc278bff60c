"""Active-active sharding: employers shared among replicas on Kubernetes Leases and labels, in
kubernetes-controller-sharding's protocol (docs/scaling.md).

``ring`` holds the pure rules (label keys, the hash key, the consistent-hash ring, shard states
from Leases); ``shard`` what one replica acts on and how it lets go of an employer (the drain);
``sharder`` the coordinator that assigns employers to shards, run by one replica at a time;
``pods`` which pods a shard keeps, and ``podlabels`` the employer label by which the API server
selects them (``--pod-employer-label``); ``replica`` wires it all into one replica.
``ShardingOptions`` (in ``resourceconsist.options``) turns it on for a manager.
"""
