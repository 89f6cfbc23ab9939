"""The engine and what it runs a collective with: negotiation, the collective guard, fusion, data movement (gather, broadcast, alltoall), join, and the ``ReduceSpec`` a reduction takes."""
