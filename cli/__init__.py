"""The command line: the only place that wires harness, pipelines, benchmarks and training together."""
