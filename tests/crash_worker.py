"""Crash-trial zygote: imports npmdb once, then forks writer children to be SIGKILLed.

Protocol (stdin/stdout lines): the parent sends ``TRIAL <n> <delay_ms> <seed>``; the zygote
forks a child that runs a random sequence of changes on the database, logging
``BEGIN <op> <json>`` before and ``COMMIT <op> <version>`` after each change to
``<db>.log`` (fsynced); the zygote kills the child with SIGKILL after ``delay_ms``
(if it is still running) and answers ``DONE <n> <killed 0|1>``. ``QUIT`` ends it.

Torch is held to one thread before anything runs, so the forked children are safe.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time


def child(db_path: str, encoder: str, seed: int, log_path: str) -> None:
    import npmdb

    rng = random.Random(seed)
    log = open(log_path, "a", buffering=1)

    def note(line: str) -> None:
        log.write(line + "\n")
        log.flush()
        os.fsync(log.fileno())

    with npmdb.open(db_path, encoder=encoder, progress=False) as db:
        live = sorted(d["id"] for d in db.documents())
        for step in range(6):
            op = rng.choice(["add", "add", "add", "delete", "optimize", "vacuum", "batch"])
            if op == "add" or (op == "delete" and not live):
                docs = [{"id": f"s{seed}-{step}-{i}",
                         "text": f"Document {seed} {step} {i} says the {rng.choice(WORDS)} of "
                                 f"{rng.choice(WORDS)} is {rng.choice(WORDS)}."}
                        for i in range(rng.randint(3, 30))]
                note("BEGIN add " + json.dumps([d["id"] for d in docs]))
                v = db.add(docs)
                live += [d["id"] for d in docs]
            elif op == "delete":
                gone = rng.sample(live, min(len(live), rng.randint(1, 5)))
                note("BEGIN delete " + json.dumps(gone))
                v = db.delete(gone)
                live = [x for x in live if x not in gone]
            elif op == "batch":
                docs = [{"id": f"b{seed}-{step}-{i}", "text": f"Batch {seed} {step} {i} of "
                         f"{rng.choice(WORDS)}."} for i in range(rng.randint(2, 8))]
                gone = rng.sample(live, min(len(live), 2))
                note("BEGIN batch " + json.dumps({"add": [d["id"] for d in docs], "delete": gone}))
                with db.batch():
                    db.add(docs)
                    db.delete(gone)
                v = db.version
                live = [x for x in live if x not in gone] + [d["id"] for d in docs]
            elif op == "optimize":
                note("BEGIN optimize []")
                v = db.optimize()
            else:
                note("BEGIN vacuum []")
                v = db.vacuum()
            note(f"COMMIT {op} {json.dumps(v)}")


WORDS = ["river", "capital", "mountain", "Greece", "Salem", "Oregon", "currency", "yen",
         "Thessaloniki", "church", "island", "Spain", "writer", "saint"]


def main() -> None:
    db_path, encoder = sys.argv[1], sys.argv[2]
    import torch
    torch.set_num_threads(1)
    import npmdb  # noqa: F401  (warm the imports the children use)
    import npmdb.database, npmdb.ingest, npmdb.maintenance  # noqa: F401,E401
    import transformers  # noqa: F401
    print("READY", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "QUIT":
            break
        n, delay_ms, seed = int(parts[1]), int(parts[2]), int(parts[3])
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                child(db_path, encoder, seed, db_path + ".log")
            except BaseException as exc:  # noqa: BLE001
                sys.stderr.write(f"child error: {type(exc).__name__}: {exc}\n")
                code = 1
            os._exit(code)
        deadline = time.monotonic() + delay_ms / 1000.0
        killed = 0
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                killed = 1
                break
            time.sleep(0.002)
        print(f"DONE {n} {killed}", flush=True)


if __name__ == "__main__":
    main()
