"""Search: the op-level DP, the graph-level evolutionary search, and the tuner loop."""
