"""What the forward computes beside the model and what a policy reads: attention rows beside SDPA, the
engine's attention functions, recent queries, each layer's kind (full, sliding, chunked), re-rotation and
KVzip's repeat prompt."""
