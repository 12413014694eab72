"""One step: the forward with what it captures, eviction per layer, the repeat pass, CUDA graphs, shared steps."""
