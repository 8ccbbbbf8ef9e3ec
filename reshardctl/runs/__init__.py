"""Run records: run directories, summaries (and later the ledger and reports built from them)."""
