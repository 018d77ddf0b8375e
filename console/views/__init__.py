"""Pages of the core: overview, Gantt, event log, approvals queue."""
