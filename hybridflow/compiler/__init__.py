"""The compiler: cluster and model descriptions, the cost model, placement search and reshard math."""
