"""Who is where: the topology (nodes and levels), topology files, and the MPI sub-communicators built from them."""
