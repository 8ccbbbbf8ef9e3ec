"""Planning: pure functions from (model, trainer layout, inference layout, topology) to transfer plans."""
