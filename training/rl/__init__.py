"""RL trainer (``algo.kind: rl``): the step loop, its update, rollouts (sync and async) and weight sync."""
