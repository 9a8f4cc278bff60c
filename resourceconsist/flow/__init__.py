"""Whether and when an action goes out: the ``cancellation`` of a pass and the threads its adapter
calls run in, and the provider API ``budget`` shared by a process."""
