"""The console: the REST API, the web pages, the Gantt, metrics and live updates. Reads through
selectors and writes through services; nothing in the core imports it."""
