"""A gang member that meets the others over TCP the way torch.distributed's TCP store does: rank 0 listens on
MASTER_ADDR:MASTER_PORT, every other node connects; each side sends its NODE_RANK and reads the other's.

It prints one JSON line (what it heard and the gang variables it was given) and exits 0 once the whole gang met;
any missing variable, a hostfile that does not list every node, or a peer that never came makes it fail.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

TIMEOUT_S = 60.0


def main() -> int:
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    rank, nodes = int(os.environ["NODE_RANK"]), int(os.environ["TESSERA_NUM_NODES"])
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    with open(os.environ["TESSERA_HOSTFILE"]) as f:
        hostfile = f.read().splitlines()
    if (
        world != nodes * local
        or len(hostfile) != nodes
        or len(os.environ["TESSERA_NODELIST"].split(",")) != nodes
    ):
        print(f"inconsistent gang: {world=} {nodes=} {local=} {hostfile=}", file=sys.stderr)
        return 2
    heard = []
    if rank == 0:
        with socket.create_server((addr, port)) as server:
            server.settimeout(TIMEOUT_S)
            for _ in range(nodes - 1):
                conn, _ = server.accept()
                with conn, conn.makefile("rw") as peer:
                    heard.append(int(peer.readline()))
                    peer.write("0\n")
                    peer.flush()
        if sorted(heard) != list(range(1, nodes)):
            print(f"rank 0 heard {heard}", file=sys.stderr)
            return 2
    else:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                conn = socket.create_connection((addr, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)  # rank 0 is not listening yet
        with conn, conn.makefile("rw") as peer:
            peer.write(f"{rank}\n")
            peer.flush()
            heard.append(int(peer.readline()))
    names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_WORLD_SIZE", "TESSERA_NUM_NODES")
    env = {k: os.environ[k] for k in (*names, "TESSERA_NODELIST", "TESSERA_HOSTFILE")}
    print(json.dumps({"rank": rank, "heard": heard, "env": env, "hostfile": hostfile}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
