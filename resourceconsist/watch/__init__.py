"""What an adapter's controller watches by default, for adapters to reuse in their own: the event
``handler``s mapping a watch event to the employers it concerns, and the predicates filtering
events (the Go frame's defaults; controller-runtime's handler and predicate packages). They
stand beside the adapter API, below the pass and the runtime."""
