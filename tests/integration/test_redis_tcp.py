#!/usr/bin/python3
"""A real Redis behind a `protocol tcp` listener.

- a deterministic redis-cli script gives byte-identical output direct and
  through twice, and twice's byte counters match what Redis itself counted;
- `redis-cli --pipe` mass insertion through twice: every reply arrives;
- redis-benchmark (plain and -P 16) through twice succeeds, and Redis's
  INFO commandstats show that every command arrived.
"""

import os
import random
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import clientkit as ck  # noqa: E402

BENCH_N = 20000
BENCH_TESTS = "set,get,incr,lpush,lrange_100,mset"
# redis-benchmark -q test title -> Redis commands whose calls it must add
BENCH_TITLES = {
    "SET": ["set"],
    "GET": ["get"],
    "INCR": ["incr"],
    "LPUSH": ["lpush"],
    "LRANGE_100 (first 100 elements)": ["lrange"],
    "MSET (10 keys)": ["mset"],
}


def cli_script():
    """A deterministic redis-cli input (one command per line) and the 1 MiB value in it."""
    rng = random.Random(20261129)
    big = rng.randbytes(h.MiB // 2).hex()          # 1 MiB of ASCII
    binary = "".join("\\x%02x" % b for b in range(256))
    lines = ["FLUSHALL", "SET k:small hello", "GET k:small",
             'SET k:bin "%s"' % binary, "GET k:bin", "STRLEN k:bin",
             "GET k:missing", "INCR k:small"]         # the last one is an error reply
    lines += ["INCR counter"] * 5 + ["INCRBY counter 100", "DECR counter", "GET counter"]
    lines += ["LPUSH list " + " ".join("v%d" % i for i in range(50)), "LRANGE list 0 -1",
              "LLEN list", "RPUSH list tail", "LRANGE list 45 -1", "LPOP list", "RPOP list"]
    lines += ["MULTI", "SET tx:a 1", "INCR tx:a", "LPUSH tx:l x y z", "LRANGE tx:l 0 -1",
              "GET tx:a", "EXEC"]
    lines += ["MULTI", "SET tx:b 1", "DISCARD", "EXISTS tx:b"]
    lines += ["SET big %s" % big, "GET big", "STRLEN big", "APPEND big END", "GETRANGE big -10 -1"]
    lines += ["HSET h f1 v1 f2 v2 f3 v3", "HGETALL h", "HINCRBY h n 7",
              "ZADD z 1 one 2 two 3 three", "ZRANGE z 0 -1 WITHSCORES", "ZSCORE z two",
              "SADD s a b c d", "SCARD s", "SISMEMBER s c"]
    for i in range(300):
        lines.append("SET key:%d %s" % (i, rng.randbytes(rng.randrange(1, 200)).hex()))
    lines.append("MGET " + " ".join("key:%d" % i for i in range(300)))
    lines += ["DEL big", "DBSIZE", "PING", "ECHO bye"]
    return ("\n".join(lines) + "\n").encode(), big


class RedisTcpTest(ck.BrokerCase):
    REDIS = True
    TMP_PREFIX = "twice-it-redis-"

    @classmethod
    def twice_config(cls):
        cls.port = h.free_port()
        return h.config(ck.listen("redis", cls.port, cls.redis.port), log_level="info")

    def fail_with_log(self, msg):
        self.fail("%s\n--- twice log tail ---\n%s" % (msg, self.tw.log_tail(40)))

    def redis_cli(self, port, args=(), stdin=b"", timeout=60):
        r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port)] + list(args),
                           input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        return r

    def test_cli_script_identical(self):
        script, big = cli_script()
        direct = self.redis_cli(self.redis.port, stdin=script)
        self.assertEqual(direct.returncode, 0, direct.stderr)
        # sanity of the reference run itself
        self.assertIn(big.encode() + b"\n", direct.stdout)
        self.assertIn(bytes(range(256)) + b"\n", direct.stdout)
        self.assertIn(b"QUEUED\nQUEUED\nQUEUED\nQUEUED\nQUEUED\nOK\n2\n3\nz\ny\nx\n2\n", direct.stdout)

        mark = len(self.tw.log_lines())
        self.redis.command("CONFIG", "RESETSTAT")
        via = self.redis_cli(self.port, stdin=script)
        info_req = ck.enc("INFO", "stats")
        stats = self.redis.info("stats")
        self.assertEqual(via.returncode, 0, via.stderr)
        if via.stdout != direct.stdout:
            i = next((k for k in range(min(len(via.stdout), len(direct.stdout)))
                      if via.stdout[k] != direct.stdout[k]), min(len(via.stdout), len(direct.stdout)))
            self.fail_with_log("redis-cli output through twice differs from direct: %d vs %d bytes, "
                               "first difference at byte %d: direct %r, via twice %r" % (
                                   len(direct.stdout), len(via.stdout), i,
                                   direct.stdout[i:i + 60], via.stdout[i:i + 60]))

        # twice's accounting of that session == what Redis counted on its side
        # (minus our own RESETSTAT reply "+OK\r\n" and INFO request).
        def data_sessions():
            lines = self.tw.log_lines()[mark:]
            recs = [h.parse_logfmt(l) for l in lines if 'msg="session closed"' in l]
            return [r for r in recs if r.get("listener") == "redis" and int(r.get("bytes_up", "0")) > 0]
        try:
            h.wait_until(data_sessions, 60, what="session closed line of the redis-cli run")
        except TimeoutError as e:
            self.fail_with_log(str(e))
        recs = data_sessions()
        self.assertEqual(len(recs), 1, "one session with data expected for the redis-cli run: %r" % recs)
        rec = recs[0]
        up, down = int(rec["bytes_up"]), int(rec["bytes_down"])
        self.assertGreater(up, len(script), rec)
        self.assertGreater(down, len(direct.stdout) - 1000, rec)
        self.assertEqual(up, int(stats["total_net_input_bytes"]) - len(info_req),
                         "bytes_up vs Redis total_net_input_bytes: %r" % rec)
        self.assertEqual(down, int(stats["total_net_output_bytes"]) - len(b"+OK\r\n"),
                         "bytes_down vs Redis total_net_output_bytes: %r" % rec)
        self.assertIn(rec["reason"], ("client_closed", "upstream_closed"))

    def test_cli_pipe_mass_insert(self):
        n = 50000
        rng = random.Random(7)
        data = b"".join(ck.enc("SET", "mass:%d" % i, rng.randbytes(rng.randrange(0, 100)))
                        for i in range(n))
        self.redis.command("FLUSHALL")
        r = self.redis_cli(self.port, ["--pipe"], stdin=data)
        out = (r.stdout + r.stderr).decode(errors="replace")
        self.assertEqual(r.returncode, 0, out)
        self.assertIn("errors: 0, replies: %d" % n, out)
        self.assertEqual(self.redis.command("DBSIZE"), str(n).encode())

    def _bench(self, extra):
        self.redis.command("FLUSHALL")
        self.redis.command("CONFIG", "RESETSTAT")
        mark = len(self.tw.log_lines())
        argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(self.port), "-q", "-n", str(BENCH_N),
                "-c", "20", "-t", BENCH_TESTS] + extra
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=90)
        out = r.stdout.decode(errors="replace")
        self.assertEqual(r.returncode, 0, "%s failed:\n%s" % (" ".join(argv), out))
        results = {}
        for piece in re.split(r"[\r\n]+", out):
            m = re.match(r"^\s*(.+?): ([0-9.]+) requests per second", piece)
            if m:
                results[m.group(1)] = float(m.group(2))
        h.log("redis-benchmark %s via twice: %s" % (" ".join(extra) or "(no pipelining)",
                                                    ", ".join("%s %.0f/s" % kv for kv in results.items())))
        for title in BENCH_TITLES:
            self.assertIn(title, results, "missing benchmark %r in:\n%s" % (title, out))
            self.assertGreater(results[title], 200, "%s: implausible rate in:\n%s" % (title, out))
        stats = {}
        for k, v in self.redis.info("commandstats").items():
            m = re.search(r"calls=(\d+)", v)
            if m:
                stats[k[len("cmdstat_"):]] = int(m.group(1))
        for title, cmds in BENCH_TITLES.items():
            for c in cmds:
                self.assertGreaterEqual(stats.get(c, 0), BENCH_N,
                                        "Redis saw %d %s calls for benchmark %r: %r" % (
                                            stats.get(c, 0), c, title, stats))
        # Every benchmark client connection is accounted in the log.
        def sessions():
            lines = self.tw.log_lines()[mark:]
            recs = [h.parse_logfmt(l) for l in lines if 'msg="session closed"' in l]
            return [r for r in recs if r.get("listener") == "redis"]
        h.wait_until(lambda: len([r for r in sessions() if int(r["bytes_up"]) > 0]) >= 20 * len(BENCH_TITLES),
                     60, what="session closed lines of the benchmark connections")
        recs = [r for r in sessions() if int(r["bytes_up"]) > 0]
        self.assertTrue(all(int(r["bytes_down"]) > 0 for r in recs),
                        "a session sent commands but got no replies: %r" %
                        [r for r in recs if int(r["bytes_down"]) == 0][:3])
        # the SET test alone sent 20000 commands of >= 30 bytes
        self.assertGreater(sum(int(r["bytes_up"]) for r in recs), BENCH_N * 30 * len(BENCH_TITLES))
        self.assertGreater(sum(int(r["bytes_down"]) for r in recs), BENCH_N * 4 * len(BENCH_TITLES))

    def test_benchmark(self):
        self._bench([])

    def test_benchmark_pipelined(self):
        self._bench(["-P", "16"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
