"""The Gantt: rows of domains (expandable to hosts) over a time window, drawn as SVG on the server.

`params` reads and validates what the page asks for, `rows` reads the database (a fixed number of
set-based queries however many rows), `svg` draws it (one <g> per row, so a row is replaced alone)."""
