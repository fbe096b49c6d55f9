"""SFT trainer (``algo.kind: sft``): its data sources and per-tag token weights."""
