"""Topics, partitions, producers, subscriptions and dispatch (non-transactional messaging)."""
