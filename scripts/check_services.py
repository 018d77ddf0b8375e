"""Stop at once, with a message naming the server and how to start it, when PostgreSQL or Redis is
unreachable. `make test` runs this first; the test suite never falls back to SQLite."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from config.preflight import ServiceUnavailable, require_postgres, require_redis


def main() -> int:
    try:
        database = require_postgres(os.environ.get("DATABASE_URL", ""), create_database=True)
        redis = require_redis(os.environ.get("REDIS_URL", ""))
    except ServiceUnavailable as error:
        print(f"make test: {error}", file=sys.stderr)
        return 2
    print(f"make test: PostgreSQL {database} and Redis {redis} are reachable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
