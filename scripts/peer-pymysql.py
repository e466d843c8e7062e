#!/usr/bin/env python3
"""The peer of `distlock bench` one task on MySQL: pymysql taking a row
lock (`BEGIN`, `SELECT ... FOR UPDATE`, `COMMIT`) in a loop on one
connection for a number of seconds, on the row table lockcore made
(`lockcore_locks`, a row of its own).

Prints one JSON line: {"peer": "pymysql", "pairs_per_s": ...}.

Usage: scripts/peer-pymysql.py mysql://USER:PASS@HOST:PORT/DB SECONDS
Needs: pip install pymysql
"""
import json
import sys
import time
import uuid
from urllib.parse import urlparse

import pymysql


def main() -> None:
    url = urlparse(sys.argv[1])
    secs = float(sys.argv[2])
    conn = pymysql.connect(
        host=url.hostname,
        port=url.port or 3306,
        user=url.username,
        password=url.password or "",
        database=url.path.lstrip("/"),
        autocommit=False,
    )
    name = f"peer-pymysql/{uuid.uuid4().hex}".encode()
    with conn.cursor() as cur:
        cur.execute("INSERT IGNORE INTO lockcore_locks (name) VALUES (%s)", (name,))
    conn.commit()
    pairs = 0
    start = time.monotonic()
    until = start + secs
    with conn.cursor() as cur:
        while time.monotonic() < until:
            conn.begin()
            cur.execute("SELECT 1 FROM lockcore_locks WHERE name = %s FOR UPDATE", (name,))
            if cur.fetchone() is None:
                sys.exit("pymysql: the row is missing")
            conn.commit()
            pairs += 1
    took = time.monotonic() - start
    with conn.cursor() as cur:
        cur.execute("DELETE FROM lockcore_locks WHERE name = %s", (name,))
    conn.commit()
    print(json.dumps({"peer": "pymysql", "pairs_per_s": pairs / took}))


if __name__ == "__main__":
    main()
