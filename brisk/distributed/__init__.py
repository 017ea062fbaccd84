"""Several ranks: DDP, FSDP2, the graphed step's in-graph gradient all-reduce and shape sync, rank bookkeeping.
Applied from outside the plain model, like every speed switch."""
