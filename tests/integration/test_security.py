#!/usr/bin/python3
"""Safe defaults: credentials never leave twice, limits hold, root is given up.

Against a real RabbitMQ (a user with its own password) and a real Redis
(requirepass), through `amqp` and `resp` listeners with a journal, debug
logging and rules that fault the very commands carrying the passwords:

  credentials    AMQP PLAIN (connection.start-ok) and Redis AUTH / HELLO AUTH
                 passwords appear nowhere: not in twice's log, not in the
                 journal file, not in `twice report`
  own connection  a duplicate re-pushed on twice's own connection lands in the
                 client's database of a password-protected Redis (AUTH, SELECT
                 replayed)
  user NAME      started as root with `user nobody`, the process runs as
                 nobody once its sockets are bound, and still relays
  max-message-size
                 a RESP bulk or an AMQP message over it ends that session with
                 a logged reason; smaller ones pass; other sessions carry on
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import clientkit as ck  # noqa: E402

import pika  # noqa: E402

REDIS_PASS = "r3dis-Pw-9qXz7"
AMQP_USER = "twiceapp"
AMQP_PASS = "amqp-Pw-k4Lm2v"


class Security(ck.BrokerCase):
    RABBITMQ = True
    REDIS = True
    REDIS_ARGS = ("--requirepass", REDIS_PASS)
    REDIS_PASSWORD = REDIS_PASS
    TMP_PREFIX = "twice-it-security-"

    @classmethod
    def set_up_class(cls):
        for args in (("add_user", AMQP_USER, AMQP_PASS),
                     ("set_permissions", "-p", "/", AMQP_USER, ".*", ".*", ".*")):
            r = cls.rabbit.ctl(*args)
            assert r.returncode == 0, r.stdout

    def amqp_params(self):
        """pika parameters of the amqp listener, as the user with its own password."""
        return ck.pika_params(self.amqp_port,
                              credentials=pika.PlainCredentials(AMQP_USER, AMQP_PASS))

    def conf(self, extra_listen="", rules=(), user=None, profile=None):
        self.amqp_port = h.free_port()
        self.resp_port = h.free_port()
        self.journal = os.path.join(self.tmp, "run.pb")
        blocks = [ck.amqp_listen("mq", self.amqp_port, self.rabbit.port, extra_listen),
                  ck.resp_listen("kv", self.resp_port, self.redis.port, profile, extra_listen)]
        text = fk.conf_text(blocks, list(rules), seed=3, journal=self.journal)
        if user is not None:
            text = "user %s\n" % user + text
        return text

    def redis_conn(self):
        return ck.Conn(self.resp_port, timeout=10)

    # -- credentials ---------------------------------------------------------

    def test_passwords_never_logged_or_journaled(self):
        rules = [
            fk.rule_block("slow-auth", "kv", "when command command=AUTH", "do delay 10ms"),
            fk.rule_block("hello-err", "kv", "when command command=HELLO", "first 1",
                          "do error NOAUTH"),
            fk.rule_block("conn", "mq", "when connect", "do delay 10ms"),
            fk.rule_block("dup", "mq", "when deliver", "do duplicate"),
        ]
        tw = self.twice(self.conf(rules=rules))
        # Redis: AUTH (both forms), HELLO 3 AUTH (refused once by a rule, then for real)
        s = self.redis_conn()
        s.send(ck.enc("AUTH", REDIS_PASS), ck.enc("AUTH", "default", REDIS_PASS),
               ck.enc("HELLO", "3", "AUTH", "default", REDIS_PASS),
               ck.enc("HELLO", "3", "AUTH", "default", REDIS_PASS), ck.enc("SET", "k", "v"))
        got = s.read_n(5)
        self.assertEqual(got[0], b"+OK\r\n")
        self.assertEqual(got[1], b"+OK\r\n")
        self.assertTrue(got[2].startswith(b"-NOAUTH"), got[2])
        self.assertTrue(got[3].startswith(b"%"), got[3])
        self.assertEqual(got[4], b"+OK\r\n")
        s.close()
        # AMQP: PLAIN with the user's own password; a message delivered (and duplicated)
        conn = pika.BlockingConnection(self.amqp_params())
        ch = conn.channel()
        ch.queue_declare("sec", auto_delete=True)
        ch.basic_publish("", "sec", b"hello", pika.BasicProperties(message_id="m-1"))
        method, _, body = None, None, None
        deadline = time.monotonic() + 60
        while method is None and time.monotonic() < deadline:
            method, _, body = ch.basic_get("sec", auto_ack=True)
        self.assertEqual(body, b"hello")
        conn.close()
        tw.stop()
        report = h.run_twice(["report", self.journal])
        secrets = [REDIS_PASS, AMQP_PASS]
        with open(self.journal, "rb") as jf:
            journal = jf.read()
        for secret in secrets:
            self.assertNotIn(secret, tw.log_text(), "a password is in twice's log")
            self.assertNotIn(secret.encode(), journal, "a password is in the journal")
            self.assertNotIn(secret, report.stdout.decode(errors="replace"),
                             "a password is in twice report")
        # not vacuous: the rules did fault the commands that carry them
        self.assertTrue(fk.fault_records(tw, rule="slow-auth"))
        self.assertTrue(fk.fault_records(tw, rule="hello-err"))

    # -- twice's own connection ----------------------------------------------

    def test_own_connection_authenticates_like_the_client(self):
        """A duplicate is re-pushed on twice's own connection: it replays the
        client's AUTH and SELECT, so the copy lands in the client's database
        of a password-protected Redis."""
        tw = self.twice(self.conf(profile="sidekiq",
                                  rules=[fk.rule_block("dup", "kv", "when deliver", "first 1",
                                                       "do duplicate")]))
        job = b'{"class":"Charge","args":[1],"jid":"0123456789abcdef01234567","queue":"sec"}'
        s = self.redis_conn()
        s.send(ck.enc("AUTH", REDIS_PASS), ck.enc("SELECT", "2"), ck.enc("DEL", "queue:sec"),
               ck.enc("LPUSH", "queue:sec", job), ck.enc("BRPOP", "queue:sec", "1"))
        got = s.read_n(5)
        self.assertEqual(got[:2], [b"+OK\r\n", b"+OK\r\n"])
        self.assertIn(job, got[4])
        s.close()
        direct = ck.Conn(self.redis.port, timeout=10)
        direct.send(ck.enc("AUTH", REDIS_PASS), ck.enc("SELECT", "2"))
        self.assertEqual(direct.read_n(2), [b"+OK\r\n", b"+OK\r\n"])

        def copy_back():
            return job in direct.raw("LRANGE", "queue:sec", "0", "-1")
        h.wait_until(copy_back, 60, what="the duplicate re-pushed into db 2")
        direct.send(ck.enc("SELECT", "0"), ck.enc("EXISTS", "queue:sec"))
        self.assertEqual(direct.read_n(2), [b"+OK\r\n", b":0\r\n"])
        direct.close()
        self.assertEqual(len(fk.fault_records(tw, rule="dup")), 1)
        # twice's own connection logs a failed command when its reply comes
        # back, which can be after the copy landed; a stopping twice waits for
        # the replies its own connections still expect, so the log is whole
        # once it has exited.
        tw.stop()
        self.assertNotIn("own redis command failed", tw.log_text())

    # -- user ----------------------------------------------------------------

    @unittest.skipUnless(os.geteuid() == 0, "needs root to switch users")
    def test_user_drops_root_after_binding(self):
        tw = self.twice(self.conf(user="nobody"))
        tw.wait_for_log(r"msg=\"dropped privileges\" user=nobody")
        with open("/proc/%d/status" % tw.pid) as f:
            uids = [l.split()[1:] for l in f if l.startswith(("Uid:", "Gid:"))]
        self.assertEqual(uids[0], ["65534"] * 4, uids)   # real, effective, saved, fs uid
        s = self.redis_conn()
        s.send(ck.enc("AUTH", REDIS_PASS), ck.enc("PING"))
        self.assertEqual(s.read_n(2), [b"+OK\r\n", b"+PONG\r\n"])
        s.close()

    def test_user_unknown_is_refused_at_start(self):
        conf_path = os.path.join(self.tmp, "bad-user.conf")
        with open(conf_path, "w") as f:
            f.write(self.conf(user="no-such-user-twice"))
        r = h.run_twice(["run", "-c", conf_path], timeout=20)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"user 'no-such-user-twice' does not exist", r.stdout + r.stderr)

    # -- max-message-size -----------------------------------------------------

    def test_max_message_size(self):
        tw = self.twice(self.conf(extra_listen="  max-message-size 1MiB\n"))
        small, big = b"s" * (512 * 1024), b"b" * (2 * 1024 * 1024)
        other = self.redis_conn()
        self.assertEqual(other.raw("AUTH", REDIS_PASS), b"+OK\r\n")
        s = self.redis_conn()
        s.send(ck.enc("AUTH", REDIS_PASS), ck.enc("SET", "small", small))
        self.assertEqual(s.read_n(2), [b"+OK\r\n", b"+OK\r\n"])
        try:
            s.send(ck.enc("SET", "big", big))
            rest = ck.read_until_eof(s)   # EOF, or a reset: twice closed with bytes unread
        except (ConnectionResetError, BrokenPipeError):
            rest = b""
        self.assertEqual(rest, b"", "the session carrying 2 MiB was not closed")
        s.close()
        tw.wait_for_log(r"msg=\"resp protocol error\".*over max-message-size 1048576")
        other.send(ck.enc("EXISTS", "big"), ck.enc("STRLEN", "small"))
        self.assertEqual(other.read_n(2), [b":0\r\n", b":524288\r\n"])
        other.close()
        # AMQP: the content header announces the size; the publisher's session ends
        params = self.amqp_params()
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.queue_declare("sizes", auto_delete=False)
        ch.queue_purge("sizes")
        # Confirmed before the big one goes: RabbitMQ routes a publish in its channel process,
        # after the reader parsed it, and a connection cut right behind it (the big message's
        # protocol error) can end that process first, so only a confirm says it was routed.
        ch.confirm_delivery()
        ch.basic_publish("", "sizes", small)
        with self.assertRaises(pika.exceptions.AMQPError):
            ch.basic_publish("", "sizes", big)
            conn.process_data_events(2)
            conn.channel()
        tw.wait_for_log(r"msg=\"amqp protocol error\".*over max-message-size 1048576")
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        # the small one only.  RabbitMQ's count lags what it has routed (even
        # directly, a passive declare right after a publish may say 0), so it
        # is asked until it says 1, then once more a moment later.
        count = lambda: ch.queue_declare("sizes", passive=True).method.message_count  # noqa: E731
        h.wait_until(lambda: count() >= 1, 60, what="the small message in queue sizes")
        # The big message's session is over (its protocol error line above),
        # so whatever of it reached RabbitMQ did so before the small one was
        # counted; 0.3 s is only a lower bound for the count's lag, which no
        # event marks.
        time.sleep(0.3)
        self.assertEqual(count(), 1)
        ch.queue_delete("sizes")
        conn.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
