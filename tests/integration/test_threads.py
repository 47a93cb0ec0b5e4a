#!/usr/bin/python3
"""`threads N`: one event loop per thread, what a user notices.

- connections are spread over the threads (GET /stats sessions_per_thread),
  every byte still arrives intact on each, and the count falls back to 0;
- a counting rule (`nth`, `every` + `limit`) counts the events of every
  thread together: against a real Redis, commands sent over eight
  connections on four threads fault exactly the commands the rule names;
- PUT /rules reaches every thread: new connections on each thread get the
  new rules;
- the same seed faults the same connections whatever thread runs first;
- SIGTERM lets open sessions of every thread finish, exits once the last
  one closed (and the acks twice delayed were sent), and closes what is
  left after `shutdown-grace`;
- `threads` is checked: 0, 65 and words are errors with a hint.
"""

import os
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402


def conf(blocks, rules=(), threads=4, admin_port=None, grace="2s"):
    text = fk.conf_text(blocks, rules, seed=7, admin_port=admin_port, token=fk.TOKEN,
                        log_level="info", grace=grace)
    return "threads %d\n" % threads + text


class ThreadsTest(h.TestCase):

    def setUp(self):
        super().setUp()
        self.echo = h.EchoServer(name="threads-echo")
        self.addCleanup(self.echo.close)
        self.admin_port = h.free_port()
        self.port = h.free_port()

    def start(self, threads=4, rules=(), extra=(), grace="2s"):
        blocks = [h.listen_block("echo", self.port, self.echo.port)] + list(extra)
        t = self.twice(conf(blocks, rules, threads=threads, admin_port=self.admin_port,
                            grace=grace))
        # "started" is the last line of the start-up, after every listener
        # and the admin API: waiting for it waits for them all.
        t.wait_for_log(r"msg=started ")
        self.api = fk.Admin(self.admin_port, fk.TOKEN)
        return t

    def redis_listener(self, name, extra=""):
        """A private Redis, and a `protocol resp` listen block NAME in front of
        it: (redis, port of the listener, block text)."""
        redis = h.start_redis(h.make_tmpdir("twice-threads-redis-"))
        self.addCleanup(redis.stop)
        port = h.free_port()
        return redis, port, h.listen_block(name, port, redis.port, extra, protocol="resp")

    def echo_conn(self, payload=b"hello\n"):
        c = h.connect(self.port)
        c.sendall(payload)
        self.assertEqual(h.recv_exact(c, len(payload)), payload)
        return c

    def test_connections_spread_and_intact(self):
        t = self.start(threads=4)
        self.assertRegex(t.log_text(), r"msg=started .*threads=4")
        hashes = h.HashServer(name="threads-hash")
        self.addCleanup(hashes.close)
        hport = h.free_port()
        t.write_config(t.conf_text + h.listen_block("hash", hport, hashes.port))
        t.signal(signal.SIGHUP)
        t.wait_for_log(r"msg=reloaded")
        conns = [h.connect(hport) for _ in range(8)]
        h.wait_until(lambda: self.api.json("/stats")["sessions_open"] == 8, 60,
                     what="eight sessions")
        st = self.api.json("/stats")
        self.assertEqual(st["threads"], 4)
        self.assertEqual(st["sessions_open"], 8)
        self.assertEqual(st["sessions_per_thread"], [2, 2, 2, 2],
                         "connections are handed to the threads in turn")
        # 8 MiB each way on every connection at once: intact on every thread.
        results = [None] * len(conns)

        def run(i):
            results[i] = h.hash_exchange(conns[i], 8 * h.MiB, 8 * h.MiB, pattern=True, seed=i,
                                         upload_seed=i + 100)

        workers = [threading.Thread(target=run, args=(i,)) for i in range(len(conns))]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        for i, res in enumerate(results):
            self.assertIsNotNone(res, "connection %d did not finish" % i)
            self.assertEqual(h.exchange_problems(res), [], "connection %d" % i)
        for c in conns:
            c.close()
        h.wait_until(lambda: self.api.json("/stats")["sessions_open"] == 0, 60,
                     what="every session to end")
        st = self.api.json("/stats")
        self.assertEqual(st["sessions_per_thread"], [0, 0, 0, 0])
        self.assertEqual(st["listeners"]["hash"]["connections"], 8)
        self.assertGreaterEqual(st["listeners"]["hash"]["bytes_up"], 8 * 8 * h.MiB)
        self.assertGreaterEqual(st["listeners"]["hash"]["bytes_down"], 8 * 8 * h.MiB)
        self.assertIsNone(t.proc.poll())

    def test_counting_rules_count_every_thread(self):
        redis, rport, listener = self.redis_listener("redis")
        rules = [fk.rule_block("tenth", "redis", "when command command=GET key=nth:*", "nth 10",
                               "do error LOADING"),
                 fk.rule_block("three", "redis", "when command command=GET key=lim:*", "every 2",
                               "limit 3", "do error READONLY")]
        self.start(threads=4, rules=rules, extra=[listener])
        conns = [fk.RespConn(rport) for _ in range(8)]
        self.addCleanup(lambda: [c.close() for c in conns])
        h.wait_until(lambda: self.api.json("/stats")["sessions_open"] == 8, 60,
                     what="eight sessions")
        self.assertEqual(self.api.json("/stats")["sessions_per_thread"], [2, 2, 2, 2])
        errors = {"nth": [], "lim": []}
        for prefix in ("nth", "lim"):
            # Round after round over the eight connections: 40 commands, each
            # on the thread of its connection.
            for rnd in range(5):
                for i, c in enumerate(conns):
                    reply = c.call("GET", "%s:%d" % (prefix, i))
                    if reply is not None:  # the key is absent: only a fault answers
                        errors[prefix].append((rnd, i, reply))
        self.assertEqual(len(errors["nth"]), 1, "nth 10 over 40 commands: %r" % errors["nth"])
        self.assertEqual(errors["nth"][0][:2], (1, 1), "the 10th GET is round 1, connection 1")
        self.assertEqual(len(errors["lim"]), 3, "every 2, limit 3: %r" % errors["lim"])
        self.assertEqual([e[:2] for e in errors["lim"]], [(0, 1), (0, 3), (0, 5)])
        rules_doc = self.api.json("/rules")
        by_name = {r["name"]: r for r in rules_doc["rules"]}
        self.assertEqual(by_name["tenth"]["seen"], 40)
        self.assertEqual(by_name["tenth"]["faults"], 1)
        self.assertEqual(by_name["three"]["faults"], 3)

    def faulted_connections(self, n=32):
        """Open n connections at once, in order; which ones twice closed at
        once (a 50% `close before` rule) as a list of booleans."""
        conns = [h.connect(self.port) for _ in range(n)]
        closed = []
        for c in conns:
            try:
                c.sendall(b"x")
                # long: a timeout would count a slow echo as a closed connection
                c.settimeout(60)
                closed.append(c.recv(1) != b"x")
            except OSError:
                closed.append(True)
            c.close()
        return closed

    def test_same_seed_faults_the_same_connections(self):
        # Session ids (and so the identities `probability` hashes) are drawn
        # in accept order, not in the order the loops happen to run.
        rule = fk.rule_block("coin", "echo", "when connect", "probability 50%",
                             "do close before")
        runs = []
        for _ in range(2):
            t = self.start(threads=4, rules=[rule])
            runs.append(self.faulted_connections())
            t.stop()
            self._twices.remove(t)
        self.assertEqual(runs[0], runs[1], "the same seed faulted other connections")
        self.assertTrue(0 < sum(runs[0]) < len(runs[0]), runs[0])

    def test_put_rules_reaches_every_thread(self):
        self.start(threads=3)
        for i in range(6):
            dt, _ = fk.echo_rtt(self.port)
            self.assertLess(dt, 0.6, "connection %d slow before any rule" % i)
        # 1 s of latency, and 0.6 s for "fast": apart even on a loaded sanitized run
        body = fk.rule_block("lat", "echo", "stream downstream", "do latency 1000ms")
        st, _, text = self.api.put("/rules", body.encode())
        self.assertEqual(st, 200, text)
        for i in range(6):
            dt, _ = fk.echo_rtt(self.port)
            self.assertGreaterEqual(dt, 0.97, "connection %d (thread %d) missed the new rule"
                                    % (i, i % 3))
        st, _, text = self.api.put("/rules", b"")
        self.assertEqual(st, 200, text)
        for i in range(6):
            dt, _ = fk.echo_rtt(self.port)
            self.assertLess(dt, 0.6, "connection %d (thread %d) kept the removed rule"
                            % (i, i % 3))

    def test_shutdown_waits_for_every_thread(self):
        t = self.start(threads=3, grace="30s")
        conns = [self.echo_conn() for _ in range(3)]
        self.assertEqual(self.api.json("/stats")["sessions_per_thread"], [1, 1, 1])
        t.signal(signal.SIGTERM)
        t.wait_for_log(r"msg=\"shutting down\"")
        # The listeners are closed, and the loops told to stop, right after
        # that line is written: wait for the closed port rather than assume it.
        h.eventually(lambda: not h.port_open(self.port), 60)
        self.assertFalse(h.port_open(self.port), "still accepting after SIGTERM")
        # A twice that wrongly ended with sessions open would do so as soon
        # as its loops saw the stop: 0.5 s is a lower bound for that.
        time.sleep(0.5)
        self.assertIsNone(t.proc.poll(), "twice exited with sessions open")
        # Sessions on every thread still relay while twice waits for them.
        for i, c in enumerate(conns):
            c.sendall(b"still %d\n" % i)
            self.assertEqual(h.recv_exact(c, 8), b"still %d\n" % i)
        for c in conns[:2]:
            c.close()
        # Once those two sessions are freed (sessions_open counts them until
        # then), their loops have looked whether they are done: a twice that
        # wrongly ended now would be exiting.  0.5 s more is a lower bound for
        # the exit itself.
        h.eventually(lambda: self.api.json("/stats")["sessions_open"] == 1, 60)
        time.sleep(0.5)
        self.assertIsNone(t.proc.poll(), "twice exited while a session was open")
        conns[2].close()
        self.assertEqual(t.proc.wait(timeout=60), 0)
        t.exit_checked = True

    def test_grace_closes_sessions_of_every_thread(self):
        t = self.start(threads=3, grace="1s")
        conns = [self.echo_conn() for _ in range(3)]
        t0 = time.monotonic()
        t.signal(signal.SIGTERM)
        self.assertEqual(t.proc.wait(timeout=15), 0)
        t.exit_checked = True
        self.assertLess(time.monotonic() - t0, 10)
        for c in conns:
            h.wait_closed(c, 30)
            c.close()
        self.assertEqual(len(fk.closed_records(t, reason="shutdown")), 3)

    def test_shutdown_sends_delayed_acks_of_every_thread(self):
        # A delayed XACK is sent by twice's own Redis connection on the loop
        # of the session that acked; that loop must not end before it is
        # sent, even when its sessions are gone at SIGTERM.
        redis, sport, listener = self.redis_listener("jobs", "profile streams")
        redis.command("XGROUP", "CREATE", "st", "g", "$", "MKSTREAM")
        entry = redis.command("XADD", "st", "*", "task", "charge")
        rules = [fk.rule_block("late", "jobs", "when ack", "do delay 1500ms")]
        t = self.start(threads=2, rules=rules, extra=[listener], grace="10s")
        first = fk.RespConn(sport)   # loop 0
        worker = fk.RespConn(sport)  # loop 1
        h.wait_until(lambda: self.api.json("/stats")["sessions_per_thread"] == [1, 1], 60,
                     what="one session per thread")
        got = worker.call("XREADGROUP", "GROUP", "g", "c", "COUNT", "1", "STREAMS", "st", ">")
        self.assertEqual(got[0][1][0][0], entry)
        self.assertEqual(worker.call("XACK", "st", "g", entry), b"1")
        worker.close()
        first.close()
        t.signal(signal.SIGTERM)
        self.assertEqual(t.proc.wait(timeout=60), 0)
        t.exit_checked = True
        pending = redis.command("XPENDING", "st", "g")
        self.assertEqual(pending[0], b"0", "the delayed XACK was lost at shutdown: %r" % pending)
        self.assertNotIn("shutdown drops commands", t.log_text())

    def test_rule_outlives_the_rules_replaced_after_it_fired(self):
        # A `close after` decided on a BLPOP cuts the connection when the
        # reply comes back; two PUT /rules meanwhile drop every loop's
        # reference to the rules it came from.  The session keeps them
        # (the ASan run of this test reads freed memory otherwise).
        _, rport, listener = self.redis_listener("redis")
        t = self.start(threads=2, extra=[listener])
        c = fk.RespConn(rport)
        self.addCleanup(c.close)
        self.assertEqual(c.call("PING"), b"PONG")
        cut = fk.rule_block("cut", "redis", "when command command=BLPOP", "do close after")
        self.assertEqual(self.api.put("/rules", cut.encode())[0], 200)
        c.sock.sendall(fk.resp_cmd("BLPOP", "nothing-here", "1"))
        # The rule has fired on the BLPOP (its fault line is written when it
        # is decided) before the rules it came from are replaced.
        t.wait_for_records("fault", rule="cut")
        for _ in range(2):
            self.assertEqual(self.api.put("/rules", b"")[0], 200)
        self.assertIn(c.read_reply(), (None, []))  # the timeout's nil, then the cut
        h.wait_closed(c.sock, 30)
        rec = h.wait_until(lambda: fk.closed_records(t), 60, what="the session's close line")
        self.assertIn("cut by rule 'cut' (close after)", rec[0].get("error", ""))
        self.assertIsNone(t.proc.poll(), "twice died")

    def test_threads_is_checked(self):
        blocks = [h.listen_block("echo", self.port, self.echo.port)]
        for bad, why in (("0", "invalid threads '0'"), ("65", "invalid threads '65'"),
                         ("many", "invalid threads 'many'")):
            path = os.path.join(self.tmp, "bad-%s.conf" % bad)
            with open(path, "w") as f:
                f.write("threads %s\n" % bad + h.config(*blocks))
            r = h.run_twice(["check", "-c", path])
            self.assertNotEqual(r.returncode, 0, bad)
            err = r.stderr.decode(errors="replace")
            self.assertIn(why, err)
            self.assertIn("a number from 1 to 64, or auto", err)
        path = os.path.join(self.tmp, "auto.conf")
        with open(path, "w") as f:
            f.write("threads auto\n" + h.config(*blocks))
        r = h.run_twice(["check", "-c", path])
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
