"""OpsPlanner's adapters: programs that claim work items through the HTTP API and do them.

Nothing here imports Django or the product's code: a host installs this package by itself."""
