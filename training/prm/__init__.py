"""Process reward model (``algo.kind: prm``): its trainer, loss, scorer and server."""
