#!/usr/bin/python3
"""Every test of test_bullmq.py with BullMQ 6 instead of 5: tests/node's `bullmq6` package (an
npm alias of bullmq 6.x, pinned by tests/node/package-lock.json), whose ioredis is a peer
dependency, met by the same ioredis 5 as BullMQ 5's.  BullMQ 6 runs the same scripts with the
same keys and arguments as 5 for every job twice reads (docs/protocols.md), so each fault must
look the same to its user; each run checks that Redis saw a 6.x queue."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_bullmq  # noqa: E402


class BullMQ6(test_bullmq.BullMQ):
    TMP_PREFIX = "twice-it-bullmq6-"
    package = "bullmq6"
    major = 6


if __name__ == "__main__":
    unittest.main()
