#!/usr/bin/env python3
"""The peer of `distlock bench` one task on etcd: python-etcd3's `Lock`
taken and released in a loop by one client for a number of seconds.

Prints one JSON line: {"peer": "python-etcd3", "pairs_per_s": ...}.

Usage: scripts/peer-etcd3.py HOST:PORT SECONDS
Needs: pip install etcd3 'protobuf<3.21' (python-etcd3's generated code
predates protobuf 4).
"""
import json
import sys
import time
import uuid

import etcd3


def main() -> None:
    host, port = sys.argv[1].rsplit(":", 1)
    secs = float(sys.argv[2])
    client = etcd3.client(host=host, port=int(port))
    # A name of its own each run; ttl as distlock bench's default (30 s).
    lock = client.lock(f"peer-etcd3/{uuid.uuid4().hex}", ttl=30)
    pairs = 0
    start = time.monotonic()
    until = start + secs
    while time.monotonic() < until:
        if not lock.acquire(timeout=10):
            sys.exit("python-etcd3: acquire timed out")
        lock.release()
        pairs += 1
    took = time.monotonic() - start
    print(json.dumps({"peer": "python-etcd3", "pairs_per_s": pairs / took}))


if __name__ == "__main__":
    main()
