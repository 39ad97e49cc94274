"""A run directory's records, and settling runs whose processes are gone."""
