"""Checks that the real servers the tests (and production) need are there, with helpful messages."""

from __future__ import annotations

import psycopg
import redis
from psycopg import sql

from config.env import EnvError, parse_database_url

START_POSTGRES = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
START_REDIS = (
    'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no '
    "--dir /var/lib/redis --logfile /var/log/redis/ci.log"
)


class ServiceUnavailable(RuntimeError):
    pass


def require_postgres(url: str, *, create_database: bool = False) -> str:
    """Connect to the PostgreSQL server of url (creating its database if asked); return 'host:port/db'."""
    if not url:
        raise ServiceUnavailable("DATABASE_URL is not set; the tests need PostgreSQL (postgresql://…)")
    try:
        config = parse_database_url("DATABASE_URL", url)
    except EnvError as error:
        raise ServiceUnavailable(str(error)) from None
    if config.is_sqlite:
        raise ServiceUnavailable(
            "DATABASE_URL points at SQLite; the tests run against PostgreSQL only (postgresql://…)"
        )
    where = f"{config.host or 'localhost'}:{config.port or 5432}"
    try:
        with psycopg.connect(
            dbname="postgres",
            host=config.host,
            port=config.port or "5432",
            user=config.user,
            password=config.password,
            connect_timeout=5,
            autocommit=True,
        ) as connection:
            exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [config.name]).fetchone()
            if create_database and not exists:
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(config.name)))
    except psycopg.OperationalError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ServiceUnavailable(
            f"PostgreSQL at {where} is unreachable ({first_line}). Start it with: {START_POSTGRES}"
        ) from None
    return f"{where}/{config.name}"


def require_redis(url: str) -> str:
    if not url:
        raise ServiceUnavailable("REDIS_URL is not set; the tests need Redis (redis://host:port/db)")
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise ServiceUnavailable(f"Redis at {url} is unreachable ({error}). Start it with: {START_REDIS}") from None
    finally:
        client.close()
    return url
