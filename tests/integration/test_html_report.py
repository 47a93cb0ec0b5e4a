#!/usr/bin/python3
"""`twice report --html` and `twice verdict --html` in a real browser, and `--format markdown`.

A real run makes the journal: a Redis, twice in front of it (`profile list`, a journal, a fixed
seed) with three rules (`racing-copy`: a copy of 30% of deliveries at once; `lost-ack`: 20% of
acks turned into a redelivery; `held-ack`: the acks of `tasks.charge_safe` delayed 300 ms),
and two Python workers taking JSON jobs off a list through twice (BLMOVE onto a processing
list, LREM as the ack), 25 jobs each of three tasks: `tasks.charge` (an effect per run: not
idempotent), `tasks.charge_safe` (SET NX on the real Redis first: idempotent) and one named
`<script>alert("x|y")</script>`, as a hostile or careless producer may name one.

Then both pages are written and loaded in headless Chromium (Debian's chromium-headless-shell,
or chromium), with JavaScript on:

- no console line at all (the pages have no script; a script that got through the escaping
  would be refused by the page's Content-Security-Policy, which logs a console error);
- the DOM has no <script> element and shows the hostile task name as text;
- the charts are there with the numbers the JSON outputs give, counted independently: one row
  of the faults-over-time chart per rule, its bins adding up to the rule's faults; a bar part
  per (task, how a delivery was counted) with deliveries, each part's count that of
  `twice report --messages --json`; one copy-delay row per task with copies, its bins adding
  up to its copies; one timeline per example message with one span per delivery;
- the verdict page says NOT IDEMPOTENT for `tasks.charge`, the verdict's badge on top;
- a screenshot of each page is kept under the build directory (the path is printed).

`--format markdown` of both commands: GitHub tables whose rows have as many cells as the
header (the `|` in the hostile name escaped), example ids shortened in the table and listed
whole under it.
"""

import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402

WAIT = 120  # seconds a wait may take on a loaded, sanitized run
JOBS = 25
HOSTILE = '<script>alert("x|y")</script>'
TASKS = ["tasks.charge", "tasks.charge_safe", HOSTILE]


def chromium():
    for name in ("chromium-headless-shell", "chromium"):
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError("no chromium-headless-shell or chromium on PATH: run `make deps`")


def artefact_dir():
    d = os.path.join(os.path.dirname(os.path.abspath(h.TWICE_BIN)), "test-artefacts")
    os.makedirs(d, exist_ok=True)
    return d


def browse(page, tmp, *args):
    """Runs headless Chromium on page with args; returns (stdout, stderr)."""
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp)
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0"]
    argv += list(args) + ["file://" + page]
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=WAIT)
    return p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


class Dom(html.parser.HTMLParser):
    """The elements of a DOM dump: (tag, attrs, text of its <title> child) in order, and the
    svg chart each sits in."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.elements, self.stack, self.text = [], [], []
        self.chart = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        el = {"tag": tag, "class": a.get("class", ""), "title": ""}
        if tag == "svg":
            self.chart = el
            el["items"] = []
        if self.chart is not None and tag in ("rect", "path", "circle"):
            self.chart["items"].append(el)
        self.elements.append((tag, a, el))
        self.stack.append(el)

    def handle_endtag(self, tag):
        if tag == "svg":
            self.chart = None
        while self.stack:
            el = self.stack.pop()
            if el["tag"] == tag:
                break

    def handle_data(self, data):
        self.text.append(data)
        # a <title> inside a drawn element: its tooltip
        if len(self.stack) >= 2 and self.stack[-1]["tag"] == "title":
            self.stack[-2]["title"] += data

    def charts(self, cls):
        return [e[2] for e in self.elements if e[0] == "svg" and cls in e[2]["class"].split()]

    def tags(self, tag):
        return [e for e in self.elements if e[0] == tag]


def worker(port, redis_port, effects, lock, stop, idle, errors):
    """Takes jobs off `jobs` through twice until stop is set; records its effects (and what
    went wrong in errors)."""
    try:
        work(port, redis_port, effects, lock, stop, idle)
    except Exception as e:  # noqa: BLE001 - handed to the test
        errors.append(e)


def work(port, redis_port, effects, lock, stop, idle):
    with fk.RespConn(port, timeout=WAIT) as c, fk.RespConn(redis_port, timeout=WAIT) as r:
        while not stop.is_set():
            job = c.call("BLMOVE", "jobs", "processing", "RIGHT", "LEFT", "0.2")
            if not job:  # a nil reply after the timeout
                idle.set()
                continue
            idle.clear()
            body = json.loads(job)
            time.sleep(0.02)
            if body["task"] != "tasks.charge_safe" or r.call("SET", "done:" + body["id"], "1", "NX") == b"OK":
                with lock:
                    effects.append(body["id"])
            c.call("LREM", "processing", "1", job)


class HtmlReport(h.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = h.make_tmpdir("twice-it-html-")
        cls.redis = h.start_redis(cls.dir)

    def run_load(self):
        port = h.free_port()
        journal = os.path.join(self.tmp, "run.pb")
        listen = ("listen redis {\n  protocol resp\n  profile list\n  bind 127.0.0.1:%d\n"
                  "  upstream 127.0.0.1:%d\n  message-id body.json.id\n  task body.json.task\n}\n"
                  % (port, self.redis.port))
        rules = [fk.rule_block("racing-copy", "redis", "when deliver", "probability 30%",
                               "do duplicate"),
                 fk.rule_block("lost-ack", "redis", "when ack", "probability 20%", "do redeliver"),
                 fk.rule_block("held-ack", "redis", "when ack task=tasks.charge_safe",
                               "do delay 300ms")]
        text = "seed 41\njournal %s\n" % journal + h.config(listen, log_level="info") + "".join(rules)
        t = self.twice(text)
        ids = []
        with fk.RespConn(port, timeout=WAIT) as c:
            for i in range(JOBS):
                for task in TASKS:
                    ids.append(str(uuid.uuid4()))
                    c.call("LPUSH", "jobs", json.dumps({"id": ids[-1], "task": task}))
        effects, lock, stop, errors = [], threading.Lock(), threading.Event(), []
        idles = [threading.Event(), threading.Event()]
        threads = [threading.Thread(target=worker,
                                    args=(port, self.redis.port, effects, lock, stop, e, errors))
                   for e in idles]
        for th in threads:
            th.start()

        def drained():
            if errors:
                raise errors[0]
            with lock:
                done = set(effects)
            rest = self.redis.command("LLEN", "jobs") + self.redis.command("LLEN", "processing")
            return rest == b"00" and all(e.is_set() for e in idles) and done == set(ids)
        try:
            h.wait_until(drained, WAIT, interval=0.1, what="the jobs drained")
        finally:
            stop.set()
            for th in threads:
                th.join(WAIT)
        t.stop()
        eff = os.path.join(self.tmp, "effects.txt")
        with open(eff, "w") as f:
            f.write("\n".join(effects) + "\n")
        return journal, eff

    def twice_cmd(self, *args, ok=(0,)):
        p = h.run_twice(list(args), timeout=WAIT)
        self.assertIn(p.returncode, ok, "twice %s: %s" % (" ".join(args), p.stderr.decode()))
        return p.stdout.decode()

    def load_page(self, page, name):
        dom, err = browse(page, self.tmp, "--dump-dom")
        console = [l for l in err.splitlines() if "CONSOLE" in l]
        self.assertEqual(console, [], "the page logged to the console")
        shot = os.path.join(artefact_dir(), name + ".png")
        _, err = browse(page, self.tmp, "--screenshot=" + shot, "--window-size=1280,2400",
                        "--hide-scrollbars")
        self.assertTrue(os.path.getsize(shot) > 10000, "no screenshot of %s: %s" % (page, err[-2000:]))
        print("screenshot: %s" % shot)
        d = Dom()
        d.feed(dom)
        self.assertEqual(d.tags("script"), [], "a <script> element in the DOM")
        self.assertIn(HOSTILE, "".join(d.text), "the hostile task name is not shown as text")
        return d

    def check_common(self, d, rep, messages):
        # faults over time: one row per rule; a row's bins add up to its faults
        faults = {r["rule"]: r["faults"] for r in rep["faults"]}
        self.assertEqual(set(faults), {"racing-copy", "lost-ack", "held-ack"})
        [chart] = d.charts("multiples")[:1]
        summed = {}
        for it in chart["items"]:
            self.assertIn("fault-bin", it["class"])
            m = re.match(r"(.*) \((.*)\): (\d+) faults, ", it["title"])
            summed[m.group(1)] = summed.get(m.group(1), 0) + int(m.group(3))
        self.assertEqual(summed, faults)
        # deliveries per task: one bar part per (task, counted) with deliveries, its count
        counted = {}
        for m in messages:
            for dl in m["deliveries"]:
                key = (m["task"], dl["counted"])
                counted[key] = counted.get(key, 0) + 1
        names = {"first": "first delivery", "copy": "copy", "set aside": "set aside",
                 "withheld": "withheld by a fault", "unreached": "never seen to finish"}
        bars = d.charts("bars")[0]
        parts = {}
        for it in bars["items"]:
            if "bar" not in it["class"].split():
                continue
            m = re.match(r"(.*): (\d+) (.*)$", it["title"], re.S)
            parts[(m.group(1), m.group(3))] = int(m.group(2))
        self.assertEqual(parts, {(t, names[c]): n for (t, c), n in counted.items()})
        # copy delays: a row per task with copies, its bins adding up to its copies
        copies = {}
        for m in messages:
            n = sum(1 for dl in m["deliveries"] if dl["counted"] == "copy")
            if n:
                copies[m["task"]] = copies.get(m["task"], 0) + n
        self.assertTrue(copies, "the run made no copy")
        delays = {}
        for it in d.charts("multiples")[1]["items"]:
            m = re.match(r"(.*): (\d+) copies, ", it["title"], re.S)
            delays[m.group(1)] = delays.get(m.group(1), 0) + int(m.group(2))
        self.assertEqual(delays, copies)
        # an example timeline per example message, a span per delivery
        by_id = {m["message_id"]: m for m in messages}
        timelines = d.charts("timeline")
        self.assertGreaterEqual(len(timelines), 3)
        codes = [e for e in d.tags("code") if "id" in e[1].get("class", "").split()]
        shown = []
        text = "".join(d.text)
        for tl in timelines:
            spans = [it for it in tl["items"] if "span" in it["class"].split()]
            m = re.match(r"delivery #1 at [^,]*, tag \d+", spans[0]["title"])
            self.assertTrue(m, spans[0]["title"])
            shown.append(len(spans))
        ids = [mid for mid in by_id if mid in text]
        self.assertTrue(codes and ids)
        self.assertTrue(all(n >= 1 for n in shown))
        return text

    def test_pages_and_markdown(self):
        journal, effects = self.run_load()
        # the inputs beside the screenshots, to look at the pages again
        shutil.copy(journal, os.path.join(artefact_dir(), "html_report.pb"))
        shutil.copy(effects, os.path.join(artefact_dir(), "html_report.effects"))
        rep = json.loads(self.twice_cmd("report", journal, "--json"))
        messages = json.loads(self.twice_cmd("report", journal, "--messages", "--json"))["messages"]
        self.assertEqual({m["task"] for m in messages}, set(TASKS))

        page = os.path.join(self.tmp, "report.html")
        out = self.twice_cmd("report", journal, "--html", page)
        self.assertIn("Faults per rule", out, "the text report goes on with --html")
        with open(page, encoding="utf-8") as f:
            raw = f.read()
        self.assertNotIn("<script", raw)
        self.assertIn("&lt;script&gt;alert(&quot;x|y&quot;)&lt;/script&gt;", raw)
        self.assertNotRegex(raw, r"(?i)(src|href)\s*=\s*\"?(https?:|//)")
        d = self.load_page(page, "html_report")
        self.check_common(d, rep, messages)

        page = os.path.join(self.tmp, "verdict.html")
        self.twice_cmd("verdict", journal, "--effects", effects, "--html", page, ok=(1,))
        verdict = json.loads(self.twice_cmd("verdict", journal, "--effects", effects, "--json", ok=(1,)))
        rows = {t["task"]: t["verdict"] for t in verdict["tasks"]}
        self.assertEqual(rows["tasks.charge"], "NOT IDEMPOTENT")
        d = self.load_page(page, "html_verdict")
        text = self.check_common(d, rep, messages)
        badges = [e for e in d.tags("span") if "badge" in e[1].get("class", "")]
        self.assertIn("big", badges[0][1]["class"])
        self.assertIn("v-not", badges[0][1]["class"])
        self.assertIn("NOT IDEMPOTENT", text)
        # each row of the verdict table says its verdict as the JSON does
        for task, v in rows.items():
            self.assertRegex(text, re.escape(task) + r"[\s\S]*?" + re.escape(v))

        # markdown: tables whose rows have as many cells as their header
        for args in (["report", journal], ["verdict", journal, "--effects", effects]):
            md = self.twice_cmd(*args, "--format", "markdown", ok=(0, 1))
            # the hostile name only inside code spans, which markdown shows as written
            self.assertNotIn("<script", re.sub(r"` [^`]* `", "", md))
            self.assertIn("\\|", md)
            tables = re.findall(r"((?:^\|.*\|\n)+)", md, re.M)
            self.assertTrue(tables, md)
            for table in tables:
                lines = table.strip("\n").split("\n")
                width = len(re.split(r"(?<!\\)\|", lines[0]))
                for line in lines:
                    self.assertEqual(len(re.split(r"(?<!\\)\|", line)), width, line)
        md = self.twice_cmd("verdict", journal, "--effects", effects, "--format", "markdown", ok=(1,))
        self.assertIn("## twice verdict: **NOT IDEMPOTENT**", md)
        doubled = [t for t in verdict["tasks"] if t["task"] == "tasks.charge"][0]["examples"]
        for mid in doubled:
            self.assertIn("` %s `" % mid, md)
            self.assertIn("` %s `\u2026" % mid[:8], md)
        # text: two examples shortened in the row (and how many more), all whole under the table
        out = self.twice_cmd("verdict", journal, "--effects", effects, ok=(1,))
        table, _, rest = out.partition("EXAMPLES in full:")
        [row] = [l for l in table.splitlines() if l.startswith("tasks.charge ")]
        want = ", ".join(m[:8] + "\u2026" for m in doubled[:2])
        want += " +%d" % (len(doubled) - 2) if len(doubled) > 2 else ""
        self.assertTrue(row.endswith(want), row)
        for mid in doubled:
            self.assertNotIn(mid, table)
            self.assertIn("%s\u2026  %s\n" % (mid[:8], mid), rest)


if __name__ == "__main__":
    unittest.main()
