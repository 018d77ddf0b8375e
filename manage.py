#!/usr/bin/env python
"""Django's command-line utility for OpsPlanner."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    from config.env import database_unreachable_line, settings_or_exit

    settings_or_exit()  # a configuration mistake is one line, not a traceback
    try:
        execute_from_command_line(sys.argv)
    except Exception as error:
        line = database_unreachable_line(error)  # so is a database that cannot be reached
        if line is None:
            raise
        sys.exit(line)


if __name__ == "__main__":
    main()
