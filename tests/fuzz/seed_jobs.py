#!/usr/bin/python3
"""seed_jobs.py - write the seeds of tests/fuzz/corpus/jobs/ (fuzz_jobs.c's input form).

    tests/fuzz/seed_jobs.py OUT_DIR

Each recorded connection of each framework (tests/unit/data/frameworks/NAME/NN-{client,
server}.bin) as the harness reads it: a byte naming the framework, then steps: a control byte,
then one RESP message; commands in order, each followed by the replies to
the commands sent so far (a worker gets its job before it finishes it).  One seed without a
fault, and one with every rule looking and deciding `duplicate` (control bits 1-3 the kind, bits 6-7 = 1).
Run it again after the recordings change.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "unit", "data", "frameworks")
# In fuzz_jobs.c's order (the first byte of an input, mod 6).
FRAMEWORKS = ["sidekiq", "celery_redis", "rq", "streams", "lists", "bullmq"]


def message_end(b, i):
    """The offset just past the RESP message that starts at b[i]."""
    t = b[i:i + 1]
    eol = b.index(b"\r\n", i)
    head = b[i + 1:eol]
    i = eol + 2
    if t in (b"+", b"-", b":", b"_", b",", b"#", b"("):
        return i
    if t in (b"$", b"=", b"!"):
        n = int(head)
        return i if n < 0 else i + n + 2
    if t in (b"*", b"~", b">", b"%", b"|"):
        n = int(head)
        if t in (b"%", b"|"):
            n *= 2
        for _ in range(max(n, 0)):
            i = message_end(b, i)
        return i
    raise ValueError("unknown RESP type %r" % t)


def messages(b):
    out, i = [], 0
    while i < len(b):
        j = message_end(b, i)
        out.append(b[i:j])
        i = j
    return out


def steps(cmds, replies, control):
    out, awaiting, r = bytearray(), 0, 0
    for c in cmds:
        out += bytes([control]) + c
        awaiting += 1
        while awaiting > 0 and r < len(replies):
            out += bytes([control | 1]) + replies[r]
            r += 1
            awaiting -= 1
    for rest in replies[r:]:
        out += bytes([control | 1]) + rest
    return bytes(out)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for index, name in enumerate(FRAMEWORKS):
        n = 1
        while os.path.exists(os.path.join(DATA, name, "%02d-client.bin" % n)):
            with open(os.path.join(DATA, name, "%02d-client.bin" % n), "rb") as f:
                cmds = messages(f.read())
            with open(os.path.join(DATA, name, "%02d-server.bin" % n), "rb") as f:
                replies = messages(f.read())
            for kind in (0, 4):  # none, duplicate (the fuzzer finds the others)
                control = 0 if kind == 0 else (kind << 1) | (1 << 6)
                with open(os.path.join(out, "%s-%02d-%d" % (name, n, kind)), "wb") as f:
                    f.write(bytes([index]) + steps(cmds, replies, control))
            n += 1


if __name__ == "__main__":
    main()
