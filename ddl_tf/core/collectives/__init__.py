"""The engine and what it runs a collective with: negotiation, the collective guard, fusion, data movement (gather, broadcast, alltoall) and join."""
