"""A refit request and its resolution: the typed inputs of a plan or a run (site, model, layouts,
topology, bucket, relay) read and validated in one place, before any planning."""
