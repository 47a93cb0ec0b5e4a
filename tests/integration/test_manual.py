#!/usr/bin/python3
"""What an installed twice tells its user, checked against what twice does (no root needed):

- the manual pages (dist/twice.1, dist/twice.conf.5) name every command and option `twice help`
  lists, every setting and rule keyword the parser knows (rules/*.c) and every directive the
  docs' tables describe, and render without a groff warning;
- the bash completion (dist/twice.bash) offers each command's options as `twice help COMMAND`
  lists them, and completes values and file names;
- the shipped default configuration (dist/twice.conf) passes `twice check` with no warning,
  and the systemd unit keeps its hardening and passes `systemd-analyze verify`;
- `twice --version` names the commit and the libraries twice was built with and runs with,
  and a build after a new commit shows the new one without a reconfigure.

The package itself (make deb, apt-get install, make install) is test_install.py's.
"""
import os
import re
import shutil
import subprocess
import unittest

import harness as h

DIST = os.path.join(h.SOURCE_DIR, "dist")
COMMANDS = ("run", "check", "report", "verdict")


def read(*parts):
    with open(os.path.join(h.SOURCE_DIR, *parts), encoding="utf-8") as f:
        return f.read()


def roff_text(path):
    """A man page's source as plain words: `\\-` is `-`, font escapes and quotes dropped."""
    with open(path, encoding="utf-8") as f:
        s = f.read()
    s = re.sub(r"\\f[BIRP]", "", s)
    s = s.replace("\\-", "-").replace("\\(dq", '"').replace("\\&", "")
    return s


def options_of(usage):
    """The options a usage text names: -c, --config, --journal-mode, ..."""
    return set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", usage))


def help_of(cmd=None):
    r = h.run_twice(["help"] + ([cmd] if cmd else []))
    if r.returncode != 0:
        raise AssertionError("twice help %s: %r" % (cmd or "", r))
    return r.stdout.decode()


def c_strings(path, array):
    """The string literals of the C array `array` (rules/conf.c's keyword lists)."""
    src = read(path)
    m = re.search(r"%s\[[A-Z_]*\] = \{(.*?)\};" % re.escape(array), src, re.S)
    if m is None:
        raise AssertionError("%s: no array %s" % (path, array))
    return re.findall(r'"([^"]+)"', m.group(1))


def x_macro_names(path, macro):
    """The names of an X-macro list (RULE_EVENTS, RULE_FIELDS in rules/rule.h)."""
    src = read(path)
    m = re.search(r"#define %s\(X\)(.*?)\n\n" % macro, src, re.S)
    return re.findall(r'X\(\w+, \d+, "([^"]+)"\)', m.group(1))


def doc_table_words(path):
    """The first word of each table row's first cell written as code: `log-level L` -> log-level."""
    return {m.group(1) for m in re.finditer(r"^\| `([a-z][a-z-]*)", read(path), re.M)}


class ManPages(h.TestCase):
    def setUp(self):
        super().setUp()
        self.page1 = roff_text(os.path.join(DIST, "twice.1"))
        self.page5 = roff_text(os.path.join(DIST, "twice.conf.5"))

    def test_twice_1_names_every_command_and_option(self):
        top = help_of()
        for cmd in COMMANDS + ("help",):
            self.assertIn("twice %s" % cmd, top, "twice help lists %s" % cmd)
            self.assertRegex(self.page1, r"\.B[IR]* twice %s\b|\.B[IR]* \"twice %s " % (cmd, cmd),
                             "twice(1) has a heading for `twice %s`" % cmd)
        self.assertIn("--version", self.page1)
        for cmd in COMMANDS:
            for opt in sorted(options_of(help_of(cmd))):
                with self.subTest(command=cmd, option=opt):
                    self.assertRegex(self.page1, r"(?<![\w-])%s(?![\w-])" % re.escape(opt),
                                     "twice(1) does not mention %s of twice %s" % (opt, cmd))

    def test_twice_1_has_the_verdict_exit_codes(self):
        # the exit codes `twice help verdict` lists, each in EXIT STATUS
        usage = help_of("verdict")
        codes = set(re.findall(r"(?<![\w=])(\d) (?:usage|the effects|a task|the journal|STALLED)",
                               usage))
        self.assertEqual(codes, {"1", "2", "3", "4", "5", "6"}, usage)
        exit_status = self.page1.split(".SH EXIT STATUS", 1)[1].split(".SH", 1)[0]
        for code in codes:
            self.assertRegex(exit_status, r"(?m)(^\.B %s$|\b%s \()" % (code, code), "exit %s" % code)

    def test_pages_name_this_version(self):
        project = re.search(r"project\(twice VERSION ([\d.]+)", read("CMakeLists.txt")).group(1)
        for page, text in (("twice.1", self.page1), ("twice.conf.5", self.page5)):
            th = re.search(r'(?m)^\.TH \S+ \d (\S+) "twice ([\d.]+)"', text)
            self.assertIsNotNone(th, page)
            self.assertEqual(th.group(2), project, "%s's .TH names twice %s" % (page, project))

    def test_twice_1_sections(self):
        for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "SIGNALS", "EXIT STATUS",
                        "FILES", "EXAMPLES", "SEE ALSO"):
            self.assertIn(".SH %s" % section, self.page1)
        for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "GLOBAL SETTINGS", "LISTENERS",
                        "RULES", "FILES", "EXAMPLES", "SEE ALSO"):
            self.assertIn(".SH %s" % section, self.page5)

    def test_twice_conf_5_names_every_setting_and_rule_word(self):
        words = {
            "global setting": c_strings("rules/conf.c", "conf_global_keywords"),
            "listener setting": c_strings("rules/listen.c", "conf_listen_keywords"),
            "rule keyword": c_strings("rules/rule_parse.c", "conf_rule_keywords"),
            "event": [e for e in x_macro_names("rules/rule.h", "RULE_EVENTS") if e != "stream"],
            "matcher field": x_macro_names("rules/rule.h", "RULE_FIELDS"),
            "action": re.findall(r'"do ([a-z-]+)', read("rules/rule_do.c")),
            "directive of docs/configuration.md": sorted(doc_table_words("docs/configuration.md")),
            "trigger or action of docs/rules.md": sorted(doc_table_words("docs/rules.md")),
        }
        for kind, names in words.items():
            self.assertTrue(names, kind)
            for name in names:
                with self.subTest(kind=kind, name=name):
                    self.assertRegex(self.page5, r"(?<![\w-])%s(?![\w-])" % re.escape(name),
                                     "twice.conf(5) does not mention the %s '%s'" % (kind, name))

    def test_pages_render_without_warnings(self):
        if shutil.which("groff") is None:
            self.skipTest("groff is not installed (groff-base, with man-db)")
        env = dict(os.environ, LC_ALL="C.UTF-8", MANWIDTH="80")
        for page in ("twice.1", "twice.conf.5"):
            path = os.path.join(DIST, page)
            r = subprocess.run(["groff", "-man", "-ww", "-z", "-Tutf8", path],
                               capture_output=True, env=env, timeout=60)
            self.assertEqual((r.returncode, r.stderr.decode()), (0, ""), page)
            r = subprocess.run(["groff", "-man", "-Tutf8", "-P-c", path], capture_output=True,
                               env=env, timeout=60)
            text = re.sub(".\x08", "", r.stdout.decode())  # grotty's overstrike (bold, underline)
            self.assertIn("NAME", text)
            self.assertIn("SEE ALSO", text)
            # what a reader sees: twice(1)'s synopsis, twice.conf(5)'s listen block
            self.assertIn("twice verdict JOURNAL --effects EFFECTS" if page == "twice.1"
                          else "listen rabbit {", re.sub(r" +", " ", text), page)


class Completion(h.TestCase):
    def complete(self, *words, cwd=None):
        """COMPREPLY for the command line `words` (the last one being completed)."""
        script = ('source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _twice; '
                  'printf "%s\\n" "${COMPREPLY[@]}"')
        r = subprocess.run(["bash", "--norc", "--noprofile", "-c", script, "bash",
                            os.path.join(DIST, "twice.bash")] + list(words),
                           capture_output=True, cwd=cwd or self.tmp, timeout=30)
        self.assertEqual(r.returncode, 0, r)
        self.assertEqual(r.stderr, b"")
        return sorted(w for w in r.stdout.decode().split("\n") if w)

    def test_commands(self):
        self.assertEqual(self.complete("twice", ""),
                         sorted(COMMANDS + ("help", "version", "--help", "--version")))
        self.assertEqual(self.complete("twice", "ve"), ["verdict", "version"])
        self.assertEqual(self.complete("twice", "help", "r"), ["report", "run"])

    def test_options_are_those_of_twice_help(self):
        for cmd in COMMANDS:
            with self.subTest(command=cmd):
                offered = set(self.complete("twice", cmd, "-"))
                self.assertEqual(offered - {"--help"}, options_of(help_of(cmd)) - {"-h", "--help"})

    def test_values_and_files(self):
        for name in ("staging.conf", "run1.pb", "effects.txt"):
            open(os.path.join(self.tmp, name), "w").close()
        os.mkdir(os.path.join(self.tmp, "journals"))
        self.assertEqual(self.complete("twice", "run", "--journal-mode", ""),
                         ["append", "new", "overwrite"])
        self.assertEqual(self.complete("twice", "check", "st"), ["staging.conf"])
        self.assertEqual(self.complete("twice", "run", "-c", "s"), ["staging.conf"])
        self.assertEqual(self.complete("twice", "report", "r"), ["run1.pb"])
        self.assertEqual(self.complete("twice", "verdict", "--effects", "e"), ["effects.txt"])
        # --journal=FILE: bash splits the word at '=' (COMP_WORDBREAKS)
        self.assertEqual(self.complete("twice", "verdict", "--journal", "=", "j"), ["journals"])
        self.assertEqual(self.complete("twice", "verdict", "--require", "overlap,w"),
                         ["overlap,window="])
        self.assertEqual(self.complete("twice", "report", "--message", ""), [])


class Shipped(h.TestCase):
    def test_default_configuration_checks(self):
        # as shipped in /etc/twice: valid, no warning, whether or not a broker runs
        path = os.path.join(DIST, "twice.conf")
        r = h.run_twice(["check", path])
        out = r.stdout.decode()
        self.assertEqual(r.returncode, 0, r)
        self.assertEqual(r.stderr, b"")
        self.assertIn("OK: 1 listener, 0 rules, 0 warnings", out)
        self.assertIn("listen rabbit: amqp 127.0.0.1:5673 -> 127.0.0.1:5672", out)
        conf = read("dist", "twice.conf")
        # the journal where the unit's StateDirectory is, in a mode a restart does not refuse
        self.assertRegex(conf, r"(?m)^journal /var/lib/twice/\S+ append$")
        grace = re.search(r"(?m)^shutdown-grace (\d+)s$", conf)
        stop = re.search(r"(?m)^TimeoutStopSec=(\d+)s$", read("dist", "twice.service.in"))
        self.assertGreater(int(stop.group(1)), int(grace.group(1)),
                           "systemd's SIGKILL must come after shutdown-grace")

    def test_unit_hardening(self):
        unit = read("dist", "twice.service.in")
        for line in ("User=twice", "AmbientCapabilities=CAP_NET_BIND_SERVICE",
                     "CapabilityBoundingSet=CAP_NET_BIND_SERVICE", "NoNewPrivileges=yes",
                     "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                     "StateDirectory=twice", "ExecReload=/bin/kill -HUP $MAINPID",
                     "KillSignal=SIGTERM"):
            self.assertRegex(unit, r"(?m)^%s$" % re.escape(line))
        caps = re.findall(r"(?m)^(?:Ambient)?Capabilit\w*=(.*)$", unit)
        self.assertEqual(set(" ".join(caps).split()), {"CAP_NET_BIND_SERVICE"})

    def test_unit_verifies(self):
        if shutil.which("systemd-analyze") is None:
            self.skipTest("systemd-analyze is not installed (package systemd)")
        unit = read("dist", "twice.service.in")
        conf = os.path.join(DIST, "twice.conf")
        unit = unit.replace("@TWICE_BIN_PATH@", os.path.abspath(h.TWICE_BIN))
        unit = unit.replace("@TWICE_CONF@", conf)
        self.assertNotRegex(unit, r"@[A-Z_]+@")
        path = os.path.join(self.tmp, "twice.service")
        with open(path, "w") as f:
            f.write(unit)
        r = subprocess.run(["systemd-analyze", "verify", "--man=no", path], capture_output=True, timeout=60)
        # an unknown or misspelt key is only a warning on stderr, with exit 0.  The pages of
        # Documentation= are not installed here (test_install.py verifies with them).
        problems = [l for l in r.stderr.decode().splitlines()
                    if "twice.service" in l]
        self.assertEqual((r.returncode, problems), (0, []), r.stderr.decode())


GIT_COMMIT_SCRIPT = os.path.join(h.SOURCE_DIR, "cmake", "git_commit.cmake")


def git(cwd, *args):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@localhost",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@localhost")
    return subprocess.run(["git", "-C", cwd] + list(args), check=True, capture_output=True,
                          env=env, timeout=60).stdout.decode().strip()


class Version(h.TestCase):
    def version(self, binary=None):
        r = subprocess.run([binary or h.TWICE_BIN, "--version"], capture_output=True, timeout=30)
        self.assertEqual((r.returncode, r.stderr), (0, b""), r)
        return r.stdout.decode()

    def test_version_commit_and_libraries(self):
        out = self.version()
        lines = out.splitlines()
        project = re.search(r"project\(twice VERSION ([\d.]+)", read("CMakeLists.txt")).group(1)
        self.assertEqual(lines[0], "twice %s" % project)
        self.assertRegex(lines[1], r"^commit \S+$")
        rows = {l.split()[0]: l.split()[1:] for l in lines[3:]}
        self.assertEqual(lines[2].split(), ["library", "built", "with", "running", "with"])
        self.assertEqual(sorted(rows), ["OpenSSL", "jansson", "libevent", "protobuf-c"])
        for lib, (built, running) in rows.items():
            self.assertRegex(built, r"^\d+\.\d+", lib)
            self.assertRegex(running, r"^\d+\.\d+", lib)
        # "running with" is the library the dynamic linker loaded: the installed package's
        if shutil.which("dpkg-query"):
            for lib, pkg in (("OpenSSL", "libssl3"), ("jansson", "libjansson4"),
                             ("protobuf-c", "libprotobuf-c1"), ("libevent", "libevent-core-2.1-7")):
                r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg],
                                   capture_output=True, timeout=30)
                if r.returncode == 0:
                    upstream = re.sub(r"^\d+:", "", r.stdout.decode()).split("-")[0]
                    self.assertTrue(upstream.startswith(rows[lib][1].split("-")[0]),
                                    "%s: %s runs, %s %s installed" % (lib, rows[lib][1], pkg, upstream))
        # the commit of this source tree, when it is a git work tree
        if shutil.which("git") and os.path.exists(os.path.join(h.SOURCE_DIR, ".git")):
            head = git(h.SOURCE_DIR, "describe", "--always")
            self.assertEqual(lines[1].split()[1].replace("-dirty", ""), head,
                             "twice --version names the commit of the source tree (stale binary? rebuild it)")

    def run_script(self, source_dir, out):
        subprocess.run(["cmake", "-DSOURCE_DIR=%s" % source_dir, "-DOUT=%s" % out, "-P",
                        GIT_COMMIT_SCRIPT], check=True, capture_output=True, timeout=60)
        with open(out) as f:
            return re.search(r'TWICE_COMMIT "([^"]*)"', f.read()).group(1)

    def test_commit_script(self):
        if shutil.which("git") is None or shutil.which("cmake") is None:
            self.skipTest("git or cmake is not installed")
        out = os.path.join(self.tmp, "twice_commit.h")
        plain = os.path.join(self.tmp, "tarball")
        os.mkdir(plain)
        self.assertEqual(self.run_script(plain, out), "unknown")
        repo = os.path.join(self.tmp, "repo")
        os.mkdir(repo)
        git(repo, "init", "-q")
        with open(os.path.join(repo, "f"), "w") as f:
            f.write("1\n")
        git(repo, "add", "f")
        git(repo, "commit", "-q", "-m", "one")
        first = git(repo, "rev-parse", "--short", "HEAD")
        self.assertEqual(self.run_script(repo, out), first)
        # unchanged: the header is not rewritten, so nothing recompiles
        before = os.stat(out).st_mtime_ns
        self.assertEqual(self.run_script(repo, out), first)
        self.assertEqual(os.stat(out).st_mtime_ns, before)
        git(repo, "commit", "-q", "--allow-empty", "-m", "two")
        second = git(repo, "rev-parse", "--short", "HEAD")
        self.assertNotEqual(first, second)
        self.assertEqual(self.run_script(repo, out), second)
        with open(os.path.join(repo, "f"), "w") as f:
            f.write("2\n")
        self.assertEqual(self.run_script(repo, out), second + "-dirty")
        # a source tree unpacked inside another repository is not that repository's commit
        inner = os.path.join(repo, "twice-0.1.0")
        os.mkdir(inner)
        self.assertEqual(self.run_script(inner, out), "unknown")

    def test_new_commit_rebuilds_version_only(self):
        # a copy of the sources as a git repository of its own: build, commit, build again
        # without reconfiguring, and --version names the new commit
        for tool in ("git", "cmake", "tar"):
            if shutil.which(tool) is None:
                self.skipTest("%s is not installed" % tool)
        src = os.path.join(self.tmp, "src")
        os.mkdir(src)
        skip = {"build", "build-asan", "build-tsan", "build-fuzz", "build-deb", ".git",
                "node_modules"}
        shutil.copytree(h.SOURCE_DIR, src, dirs_exist_ok=True,
                        ignore=lambda d, names: [n for n in names if n in skip or n.startswith("build")])
        git(src, "init", "-q")
        git(src, "add", "-A")
        git(src, "commit", "-q", "-m", "copy")
        build = os.path.join(self.tmp, "build")
        subprocess.run(["cmake", "-S", src, "-B", build, "-DTWICE_LTO=OFF", "-DTWICE_TESTS=OFF"],
                       check=True, capture_output=True, timeout=300)
        subprocess.run(["cmake", "--build", build, "-j2", "--target", "twice"], check=True,
                       capture_output=True, timeout=600)
        binary = os.path.join(build, "twice")
        self.assertIn("commit %s\n" % git(src, "rev-parse", "--short", "HEAD"), self.version(binary))
        git(src, "commit", "-q", "--allow-empty", "-m", "next")
        r = subprocess.run(["cmake", "--build", build, "-j2", "--target", "twice", "--verbose"],
                           check=True, capture_output=True, timeout=600)
        log = r.stdout.decode()
        self.assertIn("commit %s\n" % git(src, "rev-parse", "--short", "HEAD"), self.version(binary))
        self.assertNotIn("Re-running CMake", log)
        compiled = set(re.findall(r"-c (\S+\.c)\b", log))
        self.assertEqual({os.path.basename(c) for c in compiled}, {"version.c"}, log[-3000:])


if __name__ == "__main__":
    unittest.main(verbosity=2)
