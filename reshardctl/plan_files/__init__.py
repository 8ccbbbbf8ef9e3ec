"""A plan on disk: the .npz format (arrays + JSON metadata, never pickle) and the all-or-nothing
`plan --out` / `--export-transfers` files."""
