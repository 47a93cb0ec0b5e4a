#!/usr/bin/python3
"""A twice killed with SIGKILL, and the journal it leaves.

- Default flushing (`journal-flush` not set): after some traffic, once the
  journal on disk holds it, SIGKILL.  `twice report` and `twice verdict` read
  every record and say the journal "ended without a clean stop", in the text
  and in the JSON (`clean_stop`, `journal_clean_stop`), as a warning: both
  exit 0.
"""

import json
import os
import signal
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402

KIND = {v: k for k, v in fk.KIND_NAMES.items()}


class JournalCrash(h.TestCase):

    def setUp(self):
        super().setUp()
        self.echo = h.EchoServer(name="crash-echo")
        self.addCleanup(self.echo.close)
        self.port = h.free_port()
        self.journal = os.path.join(self.tmp, "journal.pb")

    def start(self):
        conf = fk.conf_text([h.listen_block("echo", self.port, self.echo.port)],
                            [fk.rule_block("slow", "echo", "stream downstream",
                                           "do latency 1ms")],
                            seed=3, journal=self.journal, log_level="info")
        return self.twice(conf)

    def kill(self, t):
        os.kill(t.pid, signal.SIGKILL)
        t.proc.wait(30)
        self.assertEqual(t.proc.returncode, -signal.SIGKILL)

    def records(self):
        _, recs, truncated = fk.decode_journal(self.journal)
        return recs, truncated

    def run_twice(self, *args):
        r = h.run_twice(list(args))
        return r.returncode, r.stdout.decode(), r.stderr.decode()

    def test_sigkill_ends_without_a_clean_stop(self):
        t = self.start()
        for _ in range(5):
            fk.echo_rtt(self.port)
        fk.wait_closed_sids(t, range(1, 6))

        def flushed():
            try:
                recs, _ = self.records()
            except (OSError, ValueError):
                return False
            return sum(r.get("kind") == KIND["close"] for r in recs) == 5
        # The writer flushes on its own (once a second by default): wait for it, then kill.
        h.wait_until(flushed, 60, what="the 5 sessions' records on disk")
        self.kill(t)
        recs, truncated = self.records()
        self.assertFalse(truncated)
        self.assertNotIn(KIND["stop"], [r.get("kind") for r in recs])

        rc, out, err = self.run_twice("report", self.journal)
        self.assertEqual(rc, 0, err)
        self.assertIn("warning: the journal ended without a clean stop (no stop record: twice "
                      "was killed or crashed)", out)
        self.assertRegex(out, r"(?m)^records\s+%d " % len(recs))
        rc, out, err = self.run_twice("report", self.journal, "--json")
        self.assertEqual(rc, 0, err)
        rep = json.loads(out)
        self.assertIs(rep["clean_stop"], False)
        self.assertIs(rep["truncated"], False)
        self.assertIsNone(rep["damage"])
        self.assertEqual(rep["by_kind"]["connect"], 5)
        self.assertIn("ended without a clean stop", err)

        effects = os.path.join(self.tmp, "effects.txt")
        open(effects, "w").close()
        rc, out, err = self.run_twice("verdict", "--journal", self.journal, "--effects", effects)
        self.assertEqual(rc, 0, (out, err))
        self.assertIn("warning: the journal ended without a clean stop", out)
        rc, out, err = self.run_twice("verdict", "--journal", self.journal, "--effects", effects,
                                      "--json")
        self.assertEqual(rc, 0, (out, err))
        self.assertIs(json.loads(out)["journal_clean_stop"], False)

        # The same traffic stopped in good order: no warning.
        os.remove(self.journal)
        self.port = h.free_port()
        t = self.start()
        fk.echo_rtt(self.port)
        t.stop()
        rc, out, err = self.run_twice("report", self.journal, "--json")
        self.assertEqual(rc, 0, err)
        self.assertIs(json.loads(out)["clean_stop"], True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
