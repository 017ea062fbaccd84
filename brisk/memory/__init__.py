"""Memory choices applied from outside the plain model: activation checkpointing, batches sized to the GPU."""
