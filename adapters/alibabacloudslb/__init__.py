"""The Alibaba Cloud SLB (CLB) adapter: keeps a load balancer's VServer group backends consistent
with the pods a Service selects.

``credentials`` reads the access key and endpoint, ``slbclient`` talks to the SLB API through the
real Alibaba Cloud SDK, and ``emulator`` is a stateful fake of that API for tests.
"""
