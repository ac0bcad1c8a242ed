"""Node side: the code that runs on compute nodes, next to each rank."""
