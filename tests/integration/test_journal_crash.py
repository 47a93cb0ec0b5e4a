#!/usr/bin/python3
"""A twice killed with SIGKILL, and the journal it leaves.

- Default flushing (`journal-flush` not set): after some traffic, once the
  journal on disk holds it, SIGKILL.  `twice report` and `twice verdict` read
  every record and say the journal "ended without a clean stop", in the text
  and in the JSON (`clean_stop`, `journal_clean_stop`), as a warning: both
  exit 0.
- `journal-flush every-record`: clients whose connections twice served (each
  got its echo back, through a rule that faults every connection), then
  SIGKILL at once, before any flush interval could pass: every record of
  those connections (their `connect`, their `fault`) is in the journal, and
  it ends on a record boundary.  `twice check` spells out a mistyped value;
  a reload that changes the setting says it needs a restart.
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

    def start(self, flush=None):
        conf = fk.conf_text([h.listen_block("echo", self.port, self.echo.port)],
                            [fk.rule_block("slow", "echo", "stream downstream",
                                           "do latency 1ms")],
                            seed=3, journal=self.journal, log_level="info")
        if flush is not None:
            conf = "journal-flush %s\n" % flush + conf
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

    def test_every_record_flush_keeps_all_before_the_kill(self):
        t = self.start(flush="every-record")
        t.wait_for_log(r"msg=\"journal open\" .*flush=every-record")
        n = 20
        clients = []
        for _ in range(n):
            s = h.connect(self.port)
            clients.append(s)
            s.sendall(b"ping\n")
            self.assertEqual(h.recv_exact(s, 5), b"ping\n")
        # Each client was served: its connect and its fault were journaled before. Kill now,
        # well inside the default flush interval.
        self.kill(t)
        for s in clients:
            s.close()
        recs, truncated = self.records()
        self.assertFalse(truncated)
        connects = sorted(r["session"] for r in recs if r.get("kind") == KIND["connect"])
        faults = sorted(r["session"] for r in recs
                        if r.get("kind") == KIND["fault"] and r.get("rule") == "slow")
        self.assertEqual(connects, list(range(1, n + 1)))
        self.assertEqual(faults, list(range(1, n + 1)))
        rc, out, err = self.run_twice("report", self.journal)
        self.assertEqual(rc, 0, err)
        self.assertIn("ended without a clean stop", out)
        self.assertNotIn("cut short", out)
        self.assertNotIn("damaged", out)

    def test_journal_flush_is_checked(self):
        conf = "journal-flush every-recrd\njournal %s\n" % self.journal + h.config(
            h.listen_block("echo", self.port, self.echo.port))
        path = os.path.join(self.tmp, "bad.conf")
        with open(path, "w") as f:
            f.write(conf)
        rc, out, err = self.run_twice("check", "-c", path)
        self.assertNotEqual(rc, 0)
        self.assertIn("bad.conf:1:15: error: unknown journal-flush 'every-recrd' (did you mean "
                      "'every-record'?)", err + out)

    def test_journal_flush_needs_a_restart(self):
        t = self.start(flush="every-record")
        # The same file again: reloaded, nothing to say of the journal.
        mark = t.log_mark()
        t.signal(signal.SIGHUP)
        t.wait_for_log(r"msg=reloaded", start=mark)
        self.assertEqual([l for l in t.log_lines()[mark:] if "journal unchanged" in l], [])
        # Another journal-flush: the journal keeps the one it started with, and says so.
        t.write_config(t.conf_text.replace("journal-flush every-record", "journal-flush 2s"))
        mark = t.log_mark()
        t.signal(signal.SIGHUP)
        t.wait_for_log(r"msg=\"journal unchanged\" .*restart", start=mark)
        t.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
