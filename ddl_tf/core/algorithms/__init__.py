"""How one buffer is reduced across ranks: the allreduce algorithms, their reduce-scatter/allgather steps, Adasum, and ``auto``'s choice among them."""
