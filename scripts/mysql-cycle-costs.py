#!/usr/bin/env python3
"""What each part of a fenced MySQL lock cycle costs on one server: the
statements lockcore sends for a lock, timed in a loop on one pymysql
connection (its own row, `pm/<random>`), beside pymysql's plain row lock
(`BEGIN`, `SELECT ... FOR UPDATE`, `COMMIT`). Each line is microseconds
per cycle, the median of three rounds of 2,000 cycles; compare lines with
each other, not with `distlock bench` (a different client).

Usage: scripts/mysql-cycle-costs.py mysql://USER:PASS@HOST:PORT/DB
Needs: pip install pymysql; the tables lockcore creates (run any lock once).
"""
import statistics
import sys
import time
import uuid
from urllib.parse import urlparse

import pymysql
from pymysql.constants import CLIENT

CLOCK = "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS UNSIGNED)"


def cursor(url):
    """A cursor on a connection of its own, in autocommit, that may send
    several statements in one request."""
    return pymysql.connect(
        host=url.hostname,
        port=url.port or 3306,
        user=url.username,
        password=url.password or "",
        database=url.path.lstrip("/"),
        autocommit=True,
        client_flag=CLIENT.MULTI_STATEMENTS,
    ).cursor()


def main() -> None:
    url = urlparse(sys.argv[1])
    cur = cursor(url)
    # The counter committed on its own runs on a second connection.
    other = cursor(url)
    name = f"pm/{uuid.uuid4().hex}".encode()
    row = "X'" + name.hex() + "'"
    cur.execute("INSERT IGNORE INTO lockcore_locks (name) VALUES (%s)", (name,))
    cur.execute("INSERT IGNORE INTO lockcore_locks_fence (name, fence) VALUES (%s, 1)", (name,))
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")

    def cycle(stmts, n=2000):
        start = time.perf_counter()
        for _ in range(n):
            for s in stmts:
                on = other if s is committed else cur
                on.execute(s)
                while on.nextset():
                    pass
        return (time.perf_counter() - start) / n * 1e6

    begin = ("SET SESSION wait_timeout = 30, innodb_lock_wait_timeout = 30; "
             "START TRANSACTION; SELECT CAST(CONNECTION_ID() AS UNSIGNED)")
    lock = f"SELECT 1 FROM lockcore_locks WHERE name = {row} FOR UPDATE"
    fence = (f"UPDATE lockcore_locks_fence SET fence = LAST_INSERT_ID({CLOCK}), holder_conn = 5, owner = 'o' "
             f"WHERE name = {row} AND fence < {CLOCK} AND EXISTS (SELECT 1 FROM lockcore_locks WHERE name = {row}); "
             "SELECT IF(ROW_COUNT() = 1, CAST(LAST_INSERT_ID() AS UNSIGNED), NULL), NULL")
    committed = (f"INSERT INTO lockcore_locks_fence (name, fence) VALUES ({row}, LAST_INSERT_ID({CLOCK})) "
                 f"ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(GREATEST(fence + 1, {CLOCK}))")
    user_lock = f"CONCAT('lockcore:', LEFT(SHA2({row}, 256), 55))"
    get_lock = f"SELECT GET_LOCK({user_lock}, 0)"
    release = f"DO RELEASE_LOCK({user_lock}); ROLLBACK; SET SESSION wait_timeout = DEFAULT"
    release_plain = "ROLLBACK; SET SESSION wait_timeout = DEFAULT"
    cases = [
        ("pymysql: BEGIN, locking read, COMMIT", ["BEGIN", lock, "COMMIT"]),
        ("fencing=none: begin, locking read, rollback", [begin, lock, release_plain]),
        ("+ the counter set in the transaction (same request)", [begin, lock + "; " + fence, release_plain]),
        ("+ the user lock that names the holder", [begin, lock + "; " + fence, get_lock, release]),
        ("before: the counter committed on its own, then the user lock",
         [begin, lock, committed, get_lock, release]),
        ("SELECT 1 (one round trip)", ["SELECT 1"]),
    ]
    rounds = {label: [] for label, _ in cases}
    for _ in range(3):
        for label, stmts in cases:
            rounds[label].append(cycle(stmts))
    for label, _ in cases:
        print(f"{statistics.median(rounds[label]):7.1f} us  {label}")
    cur.execute("DELETE FROM lockcore_locks WHERE name = %s", (name,))
    cur.execute("DELETE FROM lockcore_locks_fence WHERE name = %s", (name,))


if __name__ == "__main__":
    main()
