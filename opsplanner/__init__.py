"""The orchestration core: operations, host tasks, leases, work items, the tick, events, approvals."""
