"""Runbook operations: the per-site ledger, the promotion gate, rollback with a validation refit, status,
and the framework settings that match the active transport (docs/runbook.md)."""
