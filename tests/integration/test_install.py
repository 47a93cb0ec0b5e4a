#!/usr/bin/python3
"""twice installed as a user installs it.

- `make deb` builds twice_VERSION_ARCH.deb (in a build tree of its own under the test's temp
  dir, configured for /usr as `make deb` does; link-time optimization off to save a minute),
  and `apt-get install ./twice_*.deb` installs it with its dependencies, as the README says.
  Then: `twice --version`, `twice check /etc/twice/twice.conf` (also as the `twice` user),
  `man twice` and `man twice.conf`, the bash completion, the systemd unit installed but not
  enabled (`systemd-analyze verify` where systemd is installed), the `twice` system user and
  /var/lib/twice.  `apt-get remove` keeps the configuration and the user; `apt-get purge`
  removes everything, unless journals are left in /var/lib/twice: then they and the user stay.
- `make install DESTDIR=...` lays the files out under PREFIX (/usr/local and /usr).

On a fresh Debian 12 root (debootstrap) only when asked: TWICE_IT_FRESH_DEBIAN=1.

The package part needs root (CI runs as root) and a machine where twice is not installed
already (it would be removed): otherwise it is skipped, saying why.  Other tests are not
disturbed: they run their own binary (TWICE_BIN), and nothing here starts twice or listens.

Debian container images often exclude /usr/share/man from every package
(/etc/dpkg/dpkg.cfg.d/docker* with path-exclude): dpkg then drops the pages.  The test checks
that the pages are in the package, and reads them with `man` where dpkg installed them, or
with `man -l` from the extracted .deb where it dropped them (and says so).
"""
import glob
import grp
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import unittest

import harness as h

VERSION = re.search(r"project\(twice VERSION ([\d.]+)",
                    open(os.path.join(h.SOURCE_DIR, "CMakeLists.txt")).read()).group(1)
APT_ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
MAN_ENV = dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="100", LC_ALL="C.UTF-8")


def run(args, check=True, **kw):
    kw.setdefault("timeout", 600)
    r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, **kw)
    if check and r.returncode != 0:
        raise AssertionError("%s exited %d\n%s\n%s" % (" ".join(args), r.returncode,
                                                      r.stdout.decode()[-4000:],
                                                      r.stderr.decode()[-4000:]))
    return r


def installed(pkg):
    r = run(["dpkg-query", "-W", "-f", "${Status}", pkg], check=False)
    return r.stdout.decode()


def user_exists(name):
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def make(*args):
    # a make of its own: not the variables or the jobserver of a `make test` that runs this
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return run(["make", "--no-print-directory", "-C", h.SOURCE_DIR] + list(args), env=env)


def man_pages_excluded():
    """The path-exclude lines of dpkg's configuration that drop /usr/share/man."""
    lines = []
    for path in glob.glob("/etc/dpkg/dpkg.cfg.d/*") + ["/etc/dpkg/dpkg.cfg"]:
        try:
            with open(path) as f:
                lines += [l.strip() for l in f if l.startswith("path-exclude") and "/usr/share/man" in l]
        except OSError:
            pass
    return lines


class Package(h.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root: installs the .deb with apt-get (CI runs as root)")
        for tool in ("apt-get", "dpkg-deb", "cpack", "make"):
            if shutil.which(tool) is None:
                raise unittest.SkipTest("%s is not installed" % tool)
        if installed("twice") not in ("", "unknown ok not-installed"):
            raise unittest.SkipTest("the twice package is on this machine already (%s): "
                                    "not removing it" % installed("twice"))
        if user_exists("twice"):
            raise unittest.SkipTest("a user `twice` exists already: not touching it")

    def tearDown(self):
        # whatever failed: leave the machine as it was
        if installed("twice") not in ("", "unknown ok not-installed"):
            run(["apt-get", "purge", "-y", "-q", "twice"], check=False, env=APT_ENV)
        shutil.rmtree("/var/lib/twice", ignore_errors=True)
        if user_exists("twice"):
            run(["deluser", "--system", "--quiet", "twice"], check=False)
        super().tearDown()

    def apt(self, *args):
        return run(["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=300"] + list(args),
                   env=APT_ENV, cwd=self.debdir)

    def build_deb(self):
        self.debdir = os.path.join(self.tmp, "build-deb")
        make("deb", "DEB_BUILD=%s" % self.debdir, "CMAKE_FLAGS=-DTWICE_LTO=OFF", "JOBS=2")
        arch = run(["dpkg", "--print-architecture"]).stdout.decode().strip()
        deb = "twice_%s_%s.deb" % (VERSION, arch)
        self.assertEqual([os.path.basename(p) for p in glob.glob(os.path.join(self.debdir, "*.deb"))],
                         [deb])
        return deb

    def test_apt_install_remove_purge(self):
        deb = self.build_deb()
        path = os.path.join(self.debdir, deb)
        fields = run(["dpkg-deb", "-f", path, "Depends"]).stdout.decode()
        for dep in ("adduser", "libc6", "libevent-core", "libevent-openssl", "libssl3",
                    "libjansson4", "libprotobuf-c1"):
            self.assertIn(dep, fields, "Depends: %s" % fields)
        contents = run(["dpkg-deb", "-c", path]).stdout.decode()
        for f in ("./usr/bin/twice", "./usr/share/man/man1/twice.1", "./usr/share/man/man5/twice.conf.5",
                  "./usr/share/bash-completion/completions/twice", "./etc/twice/twice.conf",
                  "./usr/lib/systemd/system/twice.service"):
            self.assertRegex(contents, r"(?m) %s$" % re.escape(f))

        # as a user would
        self.apt("install", "./" + deb)
        self.assertEqual(installed("twice"), "install ok installed")
        r = run(["/usr/bin/twice", "--version"])
        out = r.stdout.decode()
        self.assertTrue(out.startswith("twice %s\ncommit " % VERSION), out)
        self.assertIn("OpenSSL", out)
        r = run(["/usr/bin/twice", "check", "/etc/twice/twice.conf"])
        self.assertIn(b"/etc/twice/twice.conf: OK: 1 listener, 0 rules, 0 warnings", r.stdout)
        self.assertEqual(r.stderr, b"")
        # the service's user reads it too
        r = run(["runuser", "-u", "twice", "--", "/usr/bin/twice", "check", "/etc/twice/twice.conf"])
        self.assertIn(b"OK: 1 listener", r.stdout)

        self.assertIn("/etc/twice/twice.conf",
                      run(["dpkg-query", "-W", "-f", "${Conffiles}", "twice"]).stdout.decode())
        pw = pwd.getpwnam("twice")
        self.assertLess(pw.pw_uid, 1000, "a system user")
        self.assertEqual((pw.pw_dir, pw.pw_shell), ("/var/lib/twice", "/usr/sbin/nologin"))
        st = os.stat("/var/lib/twice")
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (pw.pw_uid, 0o750))

        # installed, not enabled, not started (no systemd runs here; postinst did not fail)
        unit = "/usr/lib/systemd/system/twice.service"
        self.assertTrue(os.path.isfile(unit))
        self.assertFalse(glob.glob("/etc/systemd/system/*.wants/twice.service"))
        with open(unit) as f:
            text = f.read()
        self.assertIn("ExecStart=/usr/bin/twice run /etc/twice/twice.conf\n", text)
        if shutil.which("systemd-analyze"):
            # it reads the pages of Documentation=, unless dpkg dropped them (see above)
            man = [] if os.path.exists("/usr/share/man/man1/twice.1") else ["--man=no"]
            r = run(["systemd-analyze", "verify"] + man + [unit], check=False)
            self.assertEqual((r.returncode, r.stderr.decode()), (0, ""), "systemd-analyze verify")

        # bash completion, as bash-completion would load it
        r = run(["bash", "--norc", "-c",
                 'source /usr/share/bash-completion/completions/twice; '
                 'COMP_WORDS=(twice verdict --al); COMP_CWORD=2; _twice; echo "${COMPREPLY[*]}"'])
        self.assertEqual(r.stdout.decode().strip(), "--allow-damaged")

        self.check_man_pages(path)
        self.check_runs_as_the_unit_would()

        # remove: the configuration, the user and its directory stay for a reinstall
        self.apt("remove", "twice")
        self.assertEqual(installed("twice"), "deinstall ok config-files")
        self.assertFalse(os.path.exists("/usr/bin/twice"))
        self.assertFalse(os.path.exists(unit))
        self.assertTrue(os.path.isfile("/etc/twice/twice.conf"))
        self.assertTrue(user_exists("twice"))

        # purge: all gone
        self.apt("purge", "twice")
        self.assertIn(installed("twice"), ("", "unknown ok not-installed"))
        for p in ("/etc/twice", "/var/lib/twice", "/usr/share/man/man1/twice.1",
                  "/usr/share/bash-completion/completions/twice"):
            self.assertFalse(os.path.exists(p), p)
        self.assertFalse(user_exists("twice"))
        self.assertNotIn("twice", [g.gr_name for g in grp.getgrall()])

        # purge with journals left: they are evidence, never deleted; their owner stays
        self.apt("install", "./" + deb)
        journal = "/var/lib/twice/journal.pb"
        run(["runuser", "-u", "twice", "--", "sh", "-c", "echo run > %s" % journal])
        r = self.apt("purge", "twice")
        self.assertIn(b"/var/lib/twice still holds journals", r.stdout + r.stderr)
        self.assertTrue(os.path.isfile(journal))
        self.assertTrue(user_exists("twice"))
        self.assertEqual(os.stat(journal).st_uid, pwd.getpwnam("twice").pw_uid)
        self.assertFalse(os.path.exists("/etc/twice"))

    def unit_argv(self, conf, caps=True):
        """`twice run conf` with the unit's privileges: the twice user and group, no new
        privileges, CAP_NET_BIND_SERVICE alone in the bounding and ambient sets (caps=False:
        none).  What the unit's sandbox adds on top (ProtectSystem, ...) needs systemd."""
        cap = "+net_bind_service" if caps else ""
        return ["setpriv", "--reuid=twice", "--regid=twice", "--init-groups", "--no-new-privs",
                "--inh-caps=-all" + ("," + cap if cap else ""),
                "--ambient-caps=-all" + ("," + cap if cap else ""),
                "--bounding-set=-all" + ("," + cap if cap else ""),
                "/usr/bin/twice", "run", conf]

    def check_runs_as_the_unit_would(self):
        """The shipped file with a port under 1024, run as the unit runs it: it binds with the
        capability alone (and cannot without it), relays, writes its journal to
        /var/lib/twice as `twice`, reloads on SIGHUP and exits 0 on SIGTERM."""
        if shutil.which("setpriv") is None:
            self.fail("setpriv (util-linux) is missing")
        low = None
        for port in range(1023, 600, -1):
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                    low = port
                    break
                except OSError:
                    continue
        self.assertIsNotNone(low, "no free port under 1024")
        echo = h.EchoServer(name="echo-unit")
        self.addCleanup(echo.close)
        with open("/etc/twice/twice.conf") as f:
            conf = f.read()
        conf = conf.replace("bind 127.0.0.1:5673", "bind 127.0.0.1:%d" % low)
        conf = conf.replace("upstream 127.0.0.1:5672", "upstream 127.0.0.1:%d" % echo.port)
        conf = conf.replace("protocol amqp ", "protocol tcp  ")
        conf = conf.replace("admin 127.0.0.1:8474", "admin 127.0.0.1:%d" % h.free_port())
        self.assertIn("protocol tcp", conf)
        os.chmod(self.tmp, 0o755)  # the twice user reads its file here
        path = os.path.join(self.tmp, "unit.conf")
        with open(path, "w") as f:
            f.write(conf)
        os.chmod(path, 0o644)

        r = run(self.unit_argv(path, caps=False), check=False, timeout=60)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(b"Permission denied", r.stderr)

        log_path = os.path.join(self.tmp, "unit.log")
        t = h.Twice(h.spawn(self.unit_argv(path), log_path=log_path, cwd="/"), path, log_path, conf)
        h.at_exit(t.kill)
        t.wait_for_log(r"level=info msg=listening listener=rabbit\b")
        with socket.create_connection(("127.0.0.1", low), timeout=10) as c:
            c.settimeout(10)
            c.sendall(b"through twice\n")
            self.assertEqual(h.recv_exact(c, 14), b"through twice\n")
        mark = t.log_mark()
        os.kill(t.pid, signal.SIGHUP)
        t.wait_for_log(r"msg=reloaded", start=mark)
        os.kill(t.pid, signal.SIGTERM)
        self.assertEqual(t.proc.wait(timeout=60), 0, t.log_tail())
        journal = "/var/lib/twice/journal.pb"
        st = os.stat(journal)
        self.assertEqual(st.st_uid, pwd.getpwnam("twice").pw_uid)
        self.assertGreater(st.st_size, 0)
        r = run(["/usr/bin/twice", "report", journal, "--json"])
        self.assertIn(b'"connections"', r.stdout)
        os.unlink(journal)  # the purge below expects an empty state directory

    def check_man_pages(self, deb_path):
        if shutil.which("man") is None:
            self.fail("man is not installed: scripts/deps.sh test installs man-db")
        listed = run(["dpkg", "-L", "twice"]).stdout.decode().split("\n")
        pages = {"twice": "/usr/share/man/man1/twice.1", "twice.conf": "/usr/share/man/man5/twice.conf.5"}
        excluded = man_pages_excluded()
        for name, page in pages.items():
            with self.subTest(page=name):
                if os.path.exists(page):
                    self.assertIn(page, listed)
                    r = run(["man", "5" if name == "twice.conf" else "1", name], env=MAN_ENV)
                else:
                    # dpkg dropped it (path-exclude): read it from the package itself
                    self.assertTrue(excluded, "%s is missing but dpkg excludes no man page" % page)
                    h.log("dpkg excludes man pages here (%s): reading %s from the .deb with man -l"
                          % (excluded[0], page))
                    root = os.path.join(self.tmp, "deb-root")
                    run(["dpkg-deb", "-x", deb_path, root])
                    r = run(["man", "-l", root + page], env=MAN_ENV)
                text = re.sub(".\x08", "", r.stdout.decode())
                self.assertIn("NAME", text)
                if name == "twice":
                    self.assertIn("twice verdict JOURNAL --effects EFFECTS", re.sub(r" +", " ", text))
                else:
                    self.assertIn("shutdown-grace", text)


class FreshDebian(h.TestCase):
    """The .deb on a fresh Debian 12: a minimal root made by debootstrap (about 50 s and 100 MB
    from the Debian mirror), where `apt-get install ./twice_*.deb` must find every dependency.
    Opt-in, TWICE_IT_FRESH_DEBIAN=1, as root: it downloads a whole base system, which a test
    suite run on every change should not depend on."""

    def test_apt_install_in_a_fresh_root(self):
        if os.environ.get("TWICE_IT_FRESH_DEBIAN") != "1":
            self.skipTest("opt-in: TWICE_IT_FRESH_DEBIAN=1 (debootstraps Debian 12, ~1 min)")
        if os.geteuid() != 0 or shutil.which("debootstrap") is None:
            self.skipTest("needs root and debootstrap")
        debdir = os.path.join(self.tmp, "build-deb")
        make("deb", "DEB_BUILD=%s" % debdir, "CMAKE_FLAGS=-DTWICE_LTO=OFF", "JOBS=2")
        deb = glob.glob(os.path.join(debdir, "twice_*.deb"))[0]
        root = os.path.join(self.tmp, "bookworm")
        run(["debootstrap", "--variant=minbase", "bookworm", root, "http://deb.debian.org/debian"])
        shutil.copy("/etc/resolv.conf", os.path.join(root, "etc", "resolv.conf"))
        shutil.copy(deb, os.path.join(root, "tmp"))
        inside = "/tmp/" + os.path.basename(deb)
        run(["chroot", root, "apt-get", "update", "-q"], env=APT_ENV)
        run(["chroot", root, "apt-get", "install", "-y", "-q", inside], env=APT_ENV)
        out = run(["chroot", root, "twice", "--version"]).stdout.decode()
        self.assertTrue(out.startswith("twice %s\n" % VERSION), out)
        r = run(["chroot", root, "twice", "check", "/etc/twice/twice.conf"])
        self.assertIn(b"OK: 1 listener", r.stdout)
        run(["chroot", root, "getent", "passwd", "twice"])


class MakeInstall(h.TestCase):
    """`make install` with DESTDIR: no root, nothing outside DESTDIR."""

    EXPECTED = ("bin/twice", "share/man/man1/twice.1", "share/man/man5/twice.conf.5",
                "share/bash-completion/completions/twice", "lib/systemd/system/twice.service",
                "lib/sysusers.d/twice.conf")

    def test_destdir_layout(self):
        if shutil.which("cmake") is None or shutil.which("make") is None:
            self.skipTest("cmake or make is not installed")
        build = os.path.join(self.tmp, "build")
        for prefix, etc in (("/usr/local", "/usr/local/etc"), ("/usr", "/etc")):
            with self.subTest(prefix=prefix):
                dest = os.path.join(self.tmp, "root" + prefix.replace("/", "-"))
                make("install", "BUILD=%s" % build, "PREFIX=%s" % prefix, "DESTDIR=%s" % dest,
                     "CMAKE_FLAGS=-DTWICE_LTO=OFF -DTWICE_TESTS=OFF", "JOBS=2")
                found = set()
                for d, _, files in os.walk(dest):
                    found |= {os.path.relpath(os.path.join(d, f), dest) for f in files}
                want = {os.path.join(prefix, p).lstrip("/") for p in self.EXPECTED}
                want.add(os.path.join(etc, "twice", "twice.conf").lstrip("/"))
                self.assertEqual(found, want)
                binary = os.path.join(dest, prefix.lstrip("/"), "bin", "twice")
                self.assertTrue(run([binary, "--version"]).stdout.startswith(b"twice %s\n" % VERSION.encode()))
                with open(os.path.join(dest, prefix.lstrip("/"), "lib/systemd/system/twice.service")) as f:
                    unit = f.read()
                self.assertIn("ExecStart=%s/bin/twice run %s/twice/twice.conf\n" % (prefix, etc), unit)
                r = run([binary, "check", os.path.join(dest, etc.lstrip("/"), "twice", "twice.conf")])
                self.assertIn(b"OK: 1 listener", r.stdout)
                # installing again keeps the user's edits, the default beside them
                conf = os.path.join(dest, etc.lstrip("/"), "twice", "twice.conf")
                with open(conf, "a") as f:
                    f.write("# edited by the user\n")
                make("install", "BUILD=%s" % build, "PREFIX=%s" % prefix, "DESTDIR=%s" % dest,
                     "CMAKE_FLAGS=-DTWICE_LTO=OFF -DTWICE_TESTS=OFF", "JOBS=2")
                with open(conf) as f:
                    self.assertTrue(f.read().endswith("# edited by the user\n"))
                with open(conf + ".default") as f, open(os.path.join(h.SOURCE_DIR, "dist",
                                                                     "twice.conf")) as g:
                    self.assertEqual(f.read(), g.read())


if __name__ == "__main__":
    unittest.main(verbosity=2)
