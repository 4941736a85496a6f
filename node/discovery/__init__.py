"""Worker discovery: sources that register workers into the cluster registry and remove them when gone."""
