"""Fleet pages: pools, hosts, service owners."""
