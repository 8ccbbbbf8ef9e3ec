"""`reshardctl report`: a markdown (or one-file HTML) page with PNG plots from run directories."""
