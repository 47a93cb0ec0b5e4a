#!/usr/bin/python3
"""A run with `journal`, then `twice report` and `twice verdict` on it.

twice runs with a journal, a fixed seed and faults on some connections of
four tcp listeners (latency every 2nd connection, a byte limit on every
connection, refusal of the first two connections, none).  Then:

- while it runs, the journal on disk is flushed within ~1 s and decodes;
- after SIGTERM, `twice report` shows the seed, the config file's sha256,
  the fault count per rule equal to the `msg=fault` log lines, and the
  connections by close reason equal to the `session closed` log lines;
- `twice report --json` parses and agrees;
- the journal, decoded independently here (varint framing + protobuf wire
  format by hand, each entry's CRC-32C checked), has 1 header + N
  records and the same facts;
- a journal cut mid-record is reported as truncated, not as an error;
- `twice verdict --journal J --effects E` with an empty effects file exits 0.

JournalRestart: twice started again on the journal of an earlier run.

- by default it refuses to start, naming the file and what to do (`--journal-mode append` or
  `overwrite`, or `journal PATH append|overwrite`), and the earlier run's journal is left as it
  was, byte for byte;
- with `--journal-mode append` (or `journal PATH append`) the new run follows the earlier ones
  in the file: `twice report` lists every run and counts every record, `twice verdict` reads
  them all; a run killed with SIGKILL before the next is named as ending without a clean stop;
- with `journal PATH overwrite` the file holds the new run only, and the log says what was
  overwritten;
- a second twice on the journal of a twice still running is refused, whatever the mode.

JournalRuleChanges: the rules changed while twice runs (a rule disabled and enabled again and
the kill switch, through the admin API; a SIGHUP reload of a changed file; a rule added and
deleted and every rule replaced through the API; a reload of a broken file, which changes
nothing).  The journal has a RULES record for each change that was
applied, at the moment it was applied (between the connections made before and after it);
`twice report` lists each with its time from the start, who made it and the digest of the
rules in force after it (the file's, the new file's, a chain over one-rule edits, the body of
PUT /rules); the faults per rule agree with the
switches; `twice verdict` says the rules changed, how often, and how long faults were off, in
its text and its JSON.
"""

import collections
import hashlib
import json
import os
import re
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402

SEED = 987654321


class JournalRun(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        t0 = time.monotonic()
        cls.tmp = h.make_tmpdir("twice-it-journal-")
        cls.echo = h.EchoServer(name="journal-echo")
        cls.journal = os.path.join(cls.tmp, "journal.pb")
        cls.ports = {n: h.free_port() for n in ("lat", "lim", "refuse", "plain")}
        blocks = [h.listen_block(n, p, cls.echo.port) for n, p in cls.ports.items()]
        rules = [
            fk.rule_block("every2", "lat", "stream downstream", "every 2", "do latency 50ms"),
            fk.rule_block("cut", "lim", "stream downstream", "do limit 4B"),
            fk.rule_block("deny", "refuse", "when connect client=127.0.0.0/8", "first 2",
                          "do close before"),
        ]
        conf = fk.conf_text(blocks, rules, seed=SEED, journal=cls.journal)
        cls.t = t = h.start_twice(conf, cls.tmp)
        cls.conf_path = t.conf_path
        with open(t.conf_path, "rb") as f:
            cls.conf_sha = hashlib.sha256(f.read()).hexdigest()
        try:
            cls._traffic()
            # flushed while running (at least every second)
            cls.mid_run = cls._wait_journal_complete()
            t.stop()
        finally:
            t.kill()
            cls.echo.close()
        cls.faults = fk.fault_records(t)
        cls.closes = fk.closed_records(t)
        h.log("run + shutdown took %.1fs" % (time.monotonic() - t0))

    @classmethod
    def _traffic(cls):
        payload = b"0123456789"
        for _ in range(5):
            fk.echo_rtt(cls.ports["lat"], payload)
        for _ in range(3):
            s = h.connect(cls.ports["lim"])
            s.sendall(payload)
            got = h.recv_all(s)
            s.close()
            assert got == payload[:4], got
        for i in range(3):
            s = h.connect(cls.ports["refuse"])
            if i < 2:
                h.wait_closed(s, 30)
            else:
                s.sendall(payload)
                assert h.recv_exact(s, len(payload)) == payload
            s.close()
        for _ in range(2):
            fk.echo_rtt(cls.ports["plain"], payload)
        cls.n_conn = 13
        fk.wait_closed_sids(cls.t, range(1, cls.n_conn + 1))
        cls.closed_at = time.monotonic()

    @classmethod
    def _wait_journal_complete(cls):
        """Decode the journal of the running proxy until it holds every
        connect/close/fault record; returns (seconds after the last close, records)."""
        # A generous deadline: how soon the journal is complete is
        # test_flushed_while_running's assertion, not this wait's.
        deadline = time.monotonic() + 60
        while True:
            try:
                header, recs, _ = fk.decode_journal(cls.journal)
            except (OSError, ValueError):
                header, recs = None, []
            kinds = collections.Counter(r.get("kind") for r in recs)
            if header is not None and kinds[1] == cls.n_conn and kinds[2] == cls.n_conn:
                return time.monotonic() - cls.closed_at, len(recs)
            if time.monotonic() > deadline:
                raise AssertionError("journal of the running proxy incomplete after 60s: %r" % kinds)
            time.sleep(0.1)

    def run_twice(self, *args):
        r = h.run_twice(list(args))
        return r.returncode, r.stdout.decode(), r.stderr.decode()

    def log_fault_counts(self):
        return collections.Counter(r["rule"] for r in self.faults)

    def log_reason_counts(self):
        return collections.Counter(r["reason"] for r in self.closes)

    # ---------------------------------------------------------------------

    def test_run_produced_faults(self):
        self.assertEqual(self.log_fault_counts(), {"every2": 2, "cut": 3, "deny": 2})
        self.assertEqual(sorted(int(r["sid"]) for r in self.faults if r["rule"] == "every2"), [2, 4])
        self.assertEqual(self.log_reason_counts()["fault"], 5)
        self.assertEqual(len(self.closes), self.n_conn)

    def test_flushed_while_running(self):
        dt, n = self.mid_run
        h.log("journal complete on disk %.2fs after the last close (%d records)" % (dt, n))
        self.assertLess(dt, 3.0, "the journal was not flushed within ~1 s")

    def test_report_text(self):
        rc, out, err = self.run_twice("report", self.journal)
        self.assertEqual(rc, 0, err)
        h.log("report:\n" + out)
        self.assertRegex(out, r"(?m)^seed\s+%d$" % SEED)
        m = re.search(r"(?m)^config\s+(.*) sha256:([0-9a-f]{64})$", out)
        self.assertIsNotNone(m, out)
        self.assertEqual(m.group(1), self.conf_path)
        self.assertEqual(m.group(2), self.conf_sha)
        m = re.search(r"(?m)^records\s+(\d+) \((.*)\)$", out)
        self.assertIsNotNone(m, out)
        n_faults = len(self.faults)
        self.assertEqual(int(m.group(1)), 2 * self.n_conn + n_faults + 1)
        kinds = dict(kv.split(" ") for kv in m.group(2).split(", "))
        self.assertEqual(kinds, {"connect": str(self.n_conn), "close": str(self.n_conn),
                                 "fault": str(n_faults), "stop": "1"})
        # Faults per rule
        sec = out.split("\nFaults per rule\n", 1)[1].split("\n\n", 1)[0].splitlines()
        self.assertRegex(sec[0], r"^\s+RULE\s+FAULTS\s+ACTION\s+BY EVENT$")
        rows = {}
        for line in sec[1:]:
            rm = re.match(r"^\s+(\S+)\s+(\d+)\s+(\S+)\s+(.*)$", line)
            self.assertIsNotNone(rm, line)
            rows[rm.group(1)] = (int(rm.group(2)), rm.group(3), rm.group(4).strip())
        self.assertEqual(rows, {
            "cut": (3, "limit", "stream=3"),
            "deny": (2, "close", "connect=2"),
            "every2": (2, "latency", "stream=2"),
        })
        self.assertEqual({k: v[0] for k, v in rows.items()}, dict(self.log_fault_counts()))
        # Connections
        m = re.search(r"(?m)^\s+connections (\d+), closed (\d+), bytes up (\d+), bytes down (\d+)$", out)
        self.assertIsNotNone(m, out)
        self.assertEqual(int(m.group(1)), self.n_conn)
        self.assertEqual(int(m.group(2)), self.n_conn)
        self.assertEqual(int(m.group(3)), sum(int(r["bytes_up"]) for r in self.closes))
        self.assertEqual(int(m.group(4)), sum(int(r["bytes_down"]) for r in self.closes))
        m = re.search(r"(?m)^\s+by close reason: (.*)$", out)
        self.assertIsNotNone(m, out)
        reasons = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
        self.assertEqual(reasons, dict(self.log_reason_counts()))
        self.assertNotIn("cut short", out)

    def test_report_json(self):
        rc, out, err = self.run_twice("report", self.journal, "--json")
        self.assertEqual(rc, 0, err)
        rep = json.loads(out)
        self.assertEqual(rep["seed"], str(SEED))   # a string: 64-bit seeds do not fit a double
        self.assertEqual(rep["config_sha256"], self.conf_sha)
        self.assertEqual(rep["config_path"], self.conf_path)
        self.assertEqual(rep["version"], 1)
        self.assertFalse(rep["truncated"])
        self.assertEqual(rep["records"], 2 * self.n_conn + len(self.faults) + 1)  # + stop
        self.assertEqual(rep["by_kind"]["stop"], 1)
        self.assertEqual(rep["by_kind"]["connect"], self.n_conn)
        self.assertEqual(rep["by_kind"]["close"], self.n_conn)
        self.assertEqual(rep["by_kind"]["fault"], len(self.faults))
        self.assertEqual({f["rule"]: f["faults"] for f in rep["faults"]}, dict(self.log_fault_counts()))
        self.assertEqual({f["rule"]: f["action"] for f in rep["faults"]},
                         {"cut": "limit", "deny": "close", "every2": "latency"})
        self.assertEqual({f["rule"]: f["by_event"] for f in rep["faults"]},
                         {"cut": {"stream": 3}, "deny": {"connect": 2}, "every2": {"stream": 2}})
        conns = rep["connections"]
        self.assertEqual(conns["count"], self.n_conn)
        self.assertEqual(conns["closed"], self.n_conn)
        self.assertEqual(conns["by_close_reason"], dict(self.log_reason_counts()))
        self.assertEqual(conns["bytes_up"], sum(int(r["bytes_up"]) for r in self.closes))
        self.assertEqual(rep["deliveries"]["messages"], 0)
        # the text report says the same
        rc, text, _ = self.run_twice("report", self.journal)
        self.assertIn("sha256:%s" % rep["config_sha256"], text)
        self.assertRegex(text, r"(?m)^records\s+%d " % rep["records"])

    def test_report_message_unknown(self):
        # an id no record names: said, and exit 1, so that a script notices a wrong id
        rc, out, err = self.run_twice("report", self.journal, "--message", "no-such-id")
        self.assertEqual(rc, 1, err)
        self.assertIn("no record of the journal names message id 'no-such-id'", err)
        self.assertIn("Timeline of message no-such-id (0 records)", out)
        self.assertIn("(no record has this message id)", out)
        rc, out, err = self.run_twice("report", self.journal, "--json", "--message=no-such-id")
        self.assertEqual(rc, 1, err)
        rep = json.loads(out)
        self.assertEqual(rep["message"]["message_id"], "no-such-id")
        self.assertEqual(rep["message"]["records"], [])

    def test_journal_decoded_independently(self):
        with open(self.journal, "rb") as f:
            data = f.read()
        frames, truncated = fk.journal_frames(data)
        self.assertFalse(truncated)
        header, recs, _ = fk.decode_journal(self.journal)
        self.assertEqual(len(frames), 1 + len(recs))
        self.assertEqual(len(recs), 2 * self.n_conn + len(self.faults) + 1)
        self.assertEqual(header["version"], 1)
        # every entry ends with its checksum (decode_journal checked each)
        self.assertEqual(header.get("entry_crc32c"), 1)
        self.assertTrue(all(fk.entry_checksum_ok(fr) for fr in frames))
        # the listeners of the configuration, as the verdict reads them
        self.assertEqual([(l["name"], l["protocol"]) for l in header["listeners"]],
                         [(n, "tcp") for n in self.ports])
        self.assertEqual(header["seed"], SEED)
        self.assertEqual(header["config_sha256"].hex(), self.conf_sha)
        self.assertEqual(header["config_path"], self.conf_path)
        self.assertTrue(header.get("twice_version"))
        start_us = header["start_unix_ms"] * 1000
        self.assertLess(abs(header["start_unix_ms"] / 1000 - time.time()), 600)
        by_kind = collections.defaultdict(list)
        for r in recs:
            self.assertIn(r.get("kind"), fk.KIND_NAMES, r)
            self.assertGreaterEqual(r.get("time_unix_us", 0), start_us - 1000000, r)
            by_kind[fk.KIND_NAMES[r["kind"]]].append(r)
        self.assertEqual(set(by_kind), {"connect", "close", "fault", "stop"})
        # the clean stop is the last record
        self.assertEqual(fk.KIND_NAMES[recs[-1]["kind"]], "stop")
        stop = by_kind.pop("stop")
        self.assertEqual(len(stop), 1)
        # every session: one connect, one close, with the log's facts
        self.assertEqual(sorted(r["session"] for r in by_kind["connect"]), list(range(1, self.n_conn + 1)))
        log_close = {int(r["sid"]): r for r in self.closes}
        jr_close = {r["session"]: r for r in by_kind["close"]}
        self.assertEqual(sorted(jr_close), sorted(log_close))
        for sid, r in jr_close.items():
            lr = log_close[sid]
            self.assertEqual(r.get("close_reason_name"), lr["reason"], (r, lr))
            self.assertEqual(r.get("bytes_up", 0), int(lr["bytes_up"]))
            self.assertEqual(r.get("bytes_down", 0), int(lr["bytes_down"]))
            self.assertEqual(r.get("listener"), lr["listener"])
            self.assertEqual(r.get("client"), lr["client"])
        # every fault: as logged
        log_f = sorted((int(r["sid"]), r["rule"], r["action"]) for r in self.faults)
        jr_f = sorted((r["session"], r["rule"], r["action_name"]) for r in by_kind["fault"])
        self.assertEqual(jr_f, log_f)
        for r in by_kind["fault"]:
            self.assertEqual(r.get("event", 0), 1 if r["rule"] == "deny" else 0)
            self.assertTrue(r.get("detail"))
        # a session's records are in order: connect, fault(s), close
        order = collections.defaultdict(list)
        for r in recs[:-1]:
            order[r["session"]].append(fk.KIND_NAMES[r["kind"]])
        for sid, kinds in order.items():
            self.assertEqual(kinds[0], "connect", (sid, kinds))
            self.assertEqual(kinds[-1], "close", (sid, kinds))

    def test_truncated_journal(self):
        with open(self.journal, "rb") as f:
            data = f.read()
        cut = os.path.join(self.tmp, "cut.pb")
        with open(cut, "wb") as f:
            f.write(data[:-3])
        frames, truncated = fk.journal_frames(data[:-3])
        self.assertTrue(truncated)
        rc, out, err = self.run_twice("report", cut)
        self.assertEqual(rc, 0, err)
        self.assertIn("cut short", out)
        self.assertRegex(out, r"(?m)^records\s+%d " % (len(frames) - 1))
        rc, out, err = self.run_twice("report", cut, "--json")
        self.assertEqual(rc, 0, err)
        self.assertTrue(json.loads(out)["truncated"])
        # not a journal at all / missing: an error, not a crash
        junk = os.path.join(self.tmp, "junk.pb")
        with open(junk, "wb") as f:
            f.write(b"\xff" * 64)
        rc, out, err = self.run_twice("report", junk)
        self.assertEqual(rc, 2, (out, err))
        self.assertIn("twice report:", err)
        rc, out, err = self.run_twice("report", os.path.join(self.tmp, "missing.pb"))
        self.assertEqual(rc, 2, (out, err))

    def test_verdict_empty_effects(self):
        effects = os.path.join(self.tmp, "effects.txt")
        open(effects, "w").close()
        rc, out, err = self.run_twice("verdict", "--journal", self.journal, "--effects", effects)
        self.assertEqual(rc, 0, (out, err))
        self.assertIn("seed %d" % SEED, out)
        self.assertIn("0 side effects", out)
        self.assertRegex(out, r"(?m)^verdict: ")
        rc, out, err = self.run_twice("verdict", "--journal=%s" % self.journal,
                                      "--effects=%s" % effects, "--json")
        self.assertEqual(rc, 0, (out, err))
        json.loads(out)
        rc, out, err = self.run_twice("verdict", "--journal", self.journal)
        self.assertEqual(rc, 2)
        self.assertIn("--effects", err)

    def test_journal_first_or_by_flag(self):
        """report and verdict take the journal as their first argument or by --journal: the
        same output either way."""
        effects = os.path.join(self.tmp, "effects-forms.txt")
        open(effects, "w").close()
        for cmd, more in (("report", ["--json"]), ("verdict", ["--effects", effects, "--json"])):
            outs = []
            for form in ([self.journal], ["--journal", self.journal],
                         ["--journal=%s" % self.journal]):
                rc, out, err = self.run_twice(cmd, *(form + more))
                self.assertEqual((rc, err), (0, ""), (cmd, form, out))
                outs.append(out)
            self.assertEqual(outs[1:], outs[:1] * 2, cmd)
            self.assertEqual(json.loads(outs[0])["seed"], str(SEED))
        # A second journal is read with the first (docs/instances.md), never dropped: one that
        # is not there is an error that names it.
        rc, out, err = self.run_twice("verdict", self.journal, "other.pb", "--effects", effects)
        self.assertEqual(rc, 2, (out, err))
        self.assertIn("twice verdict: other.pb: No such file or directory", err)


class JournalRestart(h.TestCase):

    def setUp(self):
        super().setUp()
        self.echo = h.EchoServer(name="restart-echo")
        self.addCleanup(self.echo.close)
        self.journal = os.path.join(self.tmp, "journal.pb")

    def conf(self, mode=None):
        """A configuration with one tcp listener and the journal (`journal PATH MODE`)."""
        port = h.free_port()
        journal = self.journal if mode is None else "%s %s" % (self.journal, mode)
        text = fk.conf_text([h.listen_block("echo", port, self.echo.port)], seed=SEED,
                            journal=journal, log_level="info")
        return text, port

    def one_run(self, conns, mode=None, args=None, kill=False):
        """twice on the journal, `conns` connections through it, then SIGTERM (or, with kill,
        SIGKILL once their records are on disk).  Returns the twice."""
        text, port = self.conf(mode)
        t = self.twice(text, args=args)
        for _ in range(conns):
            fk.echo_rtt(port)
        fk.wait_closed_sids(t, range(1, conns + 1))
        if not kill:
            t.stop()
            return t

        def on_disk():
            try:
                runs, _ = fk.decode_journal_runs(self.journal)
            except (OSError, ValueError):
                return False
            return sum(r.get("kind") == 2 for r in runs[-1][1]) == conns
        h.wait_until(on_disk, 60, what="the run's records on disk")
        os.kill(t.pid, signal.SIGKILL)
        t.proc.wait(30)
        return t

    def refused(self, args=None, mode=None):
        """A twice started on the journal that exits at once; returns its log."""
        text, _ = self.conf(mode)
        t = self.twice(text, wait=False, args=args)
        rc = t.proc.wait(60)
        t.exit_checked = True
        self.assertEqual(rc, 1, t.log_text())
        return t, t.log_text()

    def report_json(self):
        r = h.run_twice(["report", self.journal, "--json"])
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_second_start_refuses_and_keeps_the_first_run(self):
        self.one_run(3)
        with open(self.journal, "rb") as f:
            before = f.read()
        t, log = self.refused()
        m = re.search(r'level=error msg="cannot open journal" path=(\S+) error="(.*)"$', log, re.M)
        self.assertIsNotNone(m, log)
        self.assertEqual(m.group(1), self.journal)
        err = m.group(2)
        self.assertIn("%s already holds a journal (%d bytes, its first run started "
                      % (self.journal, len(before)), err)
        for what in ("--journal-mode append", "--journal-mode overwrite", "journal PATH append",
                     "journal PATH overwrite", t.conf_path):
            self.assertIn(what, err)
        self.assertNotIn("msg=listening", log)
        with open(self.journal, "rb") as f:
            self.assertEqual(f.read(), before, "the first run's journal changed")
        rep = self.report_json()
        self.assertEqual(rep["by_kind"]["connect"], 3)
        self.assertTrue(rep["clean_stop"])
        self.assertEqual(len(rep["runs"]), 1)

    def test_append_adds_a_run_that_report_and_verdict_read(self):
        self.one_run(2)
        size = os.path.getsize(self.journal)
        t2 = self.one_run(3, args=["--journal-mode", "append"])
        self.assertEqual(len(t2.log_records("journal appended to", bytes=size)), 1, t2.log_tail())
        self.one_run(1, mode="append")  # the file's word does the same
        runs, truncated = fk.decode_journal_runs(self.journal)
        self.assertFalse(truncated)
        self.assertEqual([sorted(r["session"] for r in recs if r.get("kind") == 1)
                          for _, recs in runs], [[1, 2], [1, 2, 3], [1]])
        self.assertEqual([hd["seed"] for hd, _ in runs], [SEED] * 3)
        rep = self.report_json()
        self.assertEqual(rep["by_kind"]["connect"], 6)
        self.assertEqual(rep["by_kind"]["stop"], 3)
        self.assertEqual([(r["run"], r["records"], r["clean_stop"]) for r in rep["runs"]],
                         [(1, 5, True), (2, 7, True), (3, 3, True)])
        self.assertEqual([r["start_unix_ms"] for r in rep["runs"]],
                         [hd["start_unix_ms"] for hd, _ in runs])
        r = h.run_twice(["report", self.journal])
        out = r.stdout.decode()
        self.assertRegex(out, r"(?m)^runs\s+3 \(")
        self.assertNotIn("warning", out)
        effects = os.path.join(self.tmp, "effects.txt")
        open(effects, "w").close()
        r = h.run_twice(["verdict", "--journal", self.journal, "--effects", effects, "--json"])
        self.assertEqual(r.returncode, 0, r.stderr)
        v = json.loads(r.stdout)
        self.assertEqual((v["journal_runs"], v["journal_runs_unclean"], v["records"]), (3, 0, 15))

    def test_append_after_a_kill(self):
        self.one_run(2, kill=True)
        self.one_run(1, mode="append")
        r = h.run_twice(["report", self.journal])
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout.decode()
        self.assertIn("warning: 1 of the journal's 2 runs ended without a clean stop before the "
                      "next run started", out)
        self.assertNotIn("the journal ended without a clean stop", out)
        rep = self.report_json()
        self.assertEqual([(r["records"], r["clean_stop"]) for r in rep["runs"]],
                         [(4, False), (3, True)])
        self.assertIsNone(rep["damage"])

    def test_overwrite_replaces_the_journal(self):
        self.one_run(2)
        size = os.path.getsize(self.journal)
        t = self.one_run(1, mode="overwrite")
        self.assertEqual(len(t.log_records("journal overwritten", bytes=size)), 1, t.log_tail())
        rep = self.report_json()
        self.assertEqual(len(rep["runs"]), 1)
        self.assertEqual(rep["by_kind"]["connect"], 1)

    def test_a_mode_must_be_one_twice_knows(self):
        text, port = self.conf(mode="apend")
        conf = os.path.join(self.tmp, "typo.conf")
        with open(conf, "w") as f:
            f.write(text)
        r = h.run_twice(["check", conf])
        self.assertEqual(r.returncode, 1, r)
        line = text.splitlines().index("journal %s apend" % self.journal) + 1
        self.assertIn("%s:%d:%d: error: unknown journal mode 'apend' (did you mean 'append'?)"
                      % (conf, line, len("journal %s " % self.journal) + 1), r.stderr.decode())
        text, port = self.conf()
        with open(conf, "w") as f:
            f.write(text)
        r = h.run_twice(["run", conf, "--journal-mode", "apend"])
        self.assertEqual(r.returncode, 2, r)
        self.assertTrue(r.stderr.decode().startswith(
            "twice run: --journal-mode takes new, append or overwrite, not 'apend'\n"), r)
        self.assertFalse(os.path.exists(self.journal))
        self.assertFalse(h.port_open(port))
        # given twice, the modes must agree: neither is dropped silently
        r = h.run_twice(["run", conf, "--journal-mode", "append", "--journal-mode=overwrite"])
        self.assertEqual(r.returncode, 2, r)
        self.assertTrue(r.stderr.decode().startswith(
            "twice run: --journal-mode given twice with different modes\n"), r)
        self.assertFalse(os.path.exists(self.journal))

    def test_a_running_twice_keeps_its_journal(self):
        text, port = self.conf()
        t1 = self.twice(text)
        fk.echo_rtt(port)
        for mode in ("overwrite", "append"):
            _, log = self.refused(args=["--journal-mode", mode])
            self.assertIn("%s: in use by another twice" % self.journal, log)
        fk.echo_rtt(port)
        fk.wait_closed_sids(t1, [1, 2])
        t1.stop()
        runs, _ = fk.decode_journal_runs(self.journal)
        self.assertEqual(len(runs), 1)
        self.assertEqual(sum(r.get("kind") == 1 for r in runs[0][1]), 2)


class JournalRuleChanges(h.TestCase):

    def test_changes_are_journaled_and_reported(self):
        echo = h.EchoServer(name="changes-echo")
        self.addCleanup(echo.close)
        port, admin_port = h.free_port(), h.free_port()
        journal = os.path.join(self.tmp, "journal.pb")
        rules = [fk.rule_block("lat", "echo", "stream downstream", "do latency 1ms")]
        conf = fk.conf_text([h.listen_block("echo", port, echo.port)], rules, seed=SEED,
                            journal=journal, admin_port=admin_port, log_level="info")
        t = self.twice(conf)
        fk.wait_admin(admin_port)
        api = fk.Admin(admin_port)
        with open(t.conf_path, "rb") as f:
            sha_start = hashlib.sha256(f.read()).hexdigest()

        def conn():
            fk.echo_rtt(port)

        def call(path):
            st, _, body = api.post(path)
            self.assertEqual(st, 200, body)

        conn()                              # 1: faulted
        call("/rules/lat/disable")
        conn()                              # 2: not
        call("/rules/lat/enable")
        conn()                              # 3: faulted
        call("/faults/off")
        conn()                              # 4: not
        call("/faults/on")
        changed = conf + fk.rule_block("lat2", "echo", "stream upstream", "do latency 1ms")
        t.write_config(changed)
        with open(t.conf_path, "rb") as f:
            sha_new = hashlib.sha256(f.read()).hexdigest()
        t.signal(signal.SIGHUP)
        t.wait_for_log(r"msg=reloaded", count=1)
        conn()                              # 5: faulted by both rules
        # one rule added and deleted, then every rule replaced
        one = fk.rule_block("lat3", "echo", "stream upstream", "do latency 1ms")
        st, _, body = api.put("/rules/lat3", one)
        self.assertEqual(st, 201, body)
        st, _, body = api.request("DELETE", "/rules/lat3")
        self.assertEqual(st, 200, body)
        st, _, body = api.put("/rules", rules[0])
        self.assertEqual(st, 200, body)
        sha_add = hashlib.sha256(bytes.fromhex(sha_new) + b"PUT /rules/lat3\n"
                                 + hashlib.sha256(one.encode()).digest()).hexdigest()
        sha_del = hashlib.sha256(bytes.fromhex(sha_add) + b"DELETE /rules/lat3\n").hexdigest()
        sha_put = hashlib.sha256(rules[0].encode()).hexdigest()
        t.write_config(changed + "rule broken on echo {\n}\n")
        t.signal(signal.SIGHUP)
        t.wait_for_log(r"msg=\"reload failed\"")
        fk.wait_closed_sids(t, range(1, 6))
        t.stop()

        want = [("rule_disabled", "lat", 1, 1, False, sha_start, "POST /rules/lat/disable"),
                ("rule_enabled", "lat", 1, 0, False, sha_start, "POST /rules/lat/enable"),
                ("faults_off", "", 1, 0, True, sha_start, "POST /faults/off"),
                ("faults_on", "", 1, 0, False, sha_start, "POST /faults/on"),
                ("reloaded", "", 2, 0, False, sha_new, "SIGHUP"),
                ("rule_added", "lat3", 3, 0, False, sha_add, "PUT /rules/lat3"),
                ("rule_deleted", "lat3", 2, 0, False, sha_del, "DELETE /rules/lat3"),
                ("rules_replaced", "", 1, 0, False, sha_put, "PUT /rules")]
        # The journal: one RULES record per change applied, each between the connections of
        # before and after it; none for the reload that failed.
        header, recs, _ = fk.decode_journal(journal)
        start_us = header["start_unix_ms"] * 1000
        kinds = [fk.KIND_NAMES[r["kind"]] for r in recs]
        changes = [r for r in recs if fk.KIND_NAMES[r["kind"]] == "rules"]
        self.assertEqual([(fk.CHANGE_NAMES[r["change"]], r.get("rule", ""), r.get("rules", 0),
                           r.get("rules_disabled", 0), bool(r.get("faults_off")),
                           r["rules_sha256"].hex(), r["detail"]) for r in changes], want)
        self.assertEqual([fk.CHANGE_SOURCES[r["change_source"]] for r in changes],
                         ["admin_api"] * 4 + ["signal"] + ["admin_api"] * 3)
        for r in changes[:4] + changes[5:]:
            self.assertRegex(r["client"], r"^127\.0\.0\.1:\d+$")
        order = [k if k != "connect" else "connect%d" % r["session"]
                 for k, r in zip(kinds, recs) if k in ("connect", "rules")]
        self.assertEqual(order, ["connect1", "rules", "connect2", "rules", "connect3", "rules",
                                 "connect4", "rules", "rules", "connect5", "rules", "rules",
                                 "rules"])
        # The report: each change, its time from the start and the digest after it.
        r = h.run_twice(["report", journal])
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout.decode()
        h.log("report:\n" + out)
        sec = out.split("\nRule changes (8; ", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
        self.assertEqual(len(sec), 8, out)
        for line, w, rec in zip(sec, want, changes):
            m = re.match(r"^\s+\+(\d+\.\d{3})s  (.+?)\s{2,}(\S+)\s+(admin \S+|SIGHUP)\s+(\d+)"
                         r"(?: \((\d+) off\))?\s+(on|off)\s+([0-9a-f]{64})$", line)
            self.assertIsNotNone(m, line)
            self.assertEqual(m.group(2), w[0].replace("_", " "))
            self.assertEqual(m.group(3), w[1] or "-")
            self.assertEqual((int(m.group(5)), int(m.group(6) or 0)), (w[2], w[3]))
            self.assertEqual(m.group(7), "off" if w[4] else "on")
            self.assertEqual(m.group(8), w[5])
            self.assertEqual(m.group(4), "SIGHUP" if w[6] == "SIGHUP" else "admin " + rec["client"])
            self.assertAlmostEqual(float(m.group(1)), (rec["time_unix_us"] - start_us) / 1e6,
                                   delta=0.0015)
        # the header still names the file twice started with
        self.assertIn("sha256:%s" % sha_start, out)
        # the faults agree with the switches: connections 1, 3 and 5 only
        faults = sorted((r["rule"], r["session"]) for r in recs if fk.KIND_NAMES[r["kind"]] == "fault")
        self.assertEqual(faults, [("lat", 1), ("lat", 3), ("lat", 5), ("lat2", 5)])
        rep = json.loads(h.run_twice(["report", journal, "--json"]).stdout)
        self.assertEqual([(c["change"], c["rules_sha256"], c["offset_us"]) for c in rep["rule_changes"]],
                         [(w[0], w[5], rec["time_unix_us"] - start_us)
                          for w, rec in zip(want, changes)])
        self.assertEqual(rep["by_kind"]["rules"], 8)
        # The verdict: the rules changed, how often, and how long faults were off.
        effects = os.path.join(self.tmp, "effects.txt")
        open(effects, "w").close()
        r = h.run_twice(["verdict", journal, "--effects", effects])
        self.assertEqual(r.returncode, 0, r.stderr)
        off_us = changes[3]["time_unix_us"] - changes[2]["time_unix_us"]
        self.assertIn("rules changed 8 times during the run (1 rule enabled, 1 rule disabled, "
                      "1 faults off, 1 faults on, 1 rules replaced, 1 rule added, 1 rule deleted, "
                      "1 reloaded); faults were off for %.3fs of it" % (off_us / 1e6),
                      r.stdout.decode())
        r = h.run_twice(["verdict", journal, "--effects", effects, "--json"])
        v = json.loads(r.stdout)["rule_changes"]
        self.assertEqual((v["count"], v["faults_off_us"]), (8, off_us))
        self.assertEqual(v["by_change"], {"rule_enabled": 1, "rule_disabled": 1, "faults_off": 1,
                                          "faults_on": 1, "rules_replaced": 1, "rule_added": 1,
                                          "rule_deleted": 1, "reloaded": 1})


if __name__ == "__main__":
    unittest.main(verbosity=2)
