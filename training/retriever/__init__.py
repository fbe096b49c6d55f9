"""Retriever RL (``algo.kind: retriever``): the query tower's trainer and loss."""
