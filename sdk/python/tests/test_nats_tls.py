"""TLS and mTLS to NATS from Python (`hermes_agents.worker.nats_tls`, read by the Worker from
`HERMES_NATS_TLS_*` as the Rust services read `nats.tls.*`), against a real nats-server that
requires TLS and verifies clients. The certificates are made with the `openssl` command, so the
test is skipped on a machine without it.
"""

import asyncio
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

from hermes_agents import errors
from hermes_agents.worker import nats_tls
from test_stack import ROOT

NATS_SERVER = os.environ.get("HERMES_NATS_SERVER_BIN", str(ROOT / ".tools" / "bin" / "nats-server"))


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def leaf(dir, name, usage, san=None):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=dir)
    ext = dir / f"{name}.ext"
    ext.write_text((f"subjectAltName={san}\n" if san else "") + f"extendedKeyUsage={usage}\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "1", "-extfile", ext.name, cwd=dir)


@unittest.skipUnless(shutil.which("openssl"), "needs the openssl command to make certificates")
class NatsTls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        d = pathlib.Path(cls.dir.name)
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=hermes test ca", cwd=d)
        leaf(d, "server", "serverAuth", "IP:127.0.0.1,DNS:localhost")
        leaf(d, "client", "clientAuth")
        leaf(d, "renewed", "clientAuth")
        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        cls.port, cls.monitor = ports
        (d / "server.conf").write_text(
            f'tls {{\n cert_file: "{d / "server.pem"}"\n key_file: "{d / "server.key"}"\n'
            f' ca_file: "{d / "ca.pem"}"\n verify: true\n}}\n')
        cls.server = subprocess.Popen([NATS_SERVER, "-c", str(d / "server.conf"), "-a", "127.0.0.1", "-p",
                                       str(cls.port), "-m", str(cls.monitor), "-js", "-sd", str(d / "store")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", cls.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        cls.url = f"tls://127.0.0.1:{cls.port}"
        cls.d = d

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.server.wait()
        cls.dir.cleanup()

    async def connect(self, url, tls):
        import nats

        options = {"tls": tls} if tls is not None else {}
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=0, **options)
        try:
            info = await nc.jetstream().account_info()
            return info
        finally:
            await nc.close()

    def test_mutual_tls_connects_and_without_a_client_certificate_it_is_refused(self):
        d = self.d
        tls = nats_tls(str(d / "ca.pem"), str(d / "client.pem"), str(d / "client.key"))
        self.assertIsNotNone(asyncio.run(self.connect(self.url, tls)))
        for what, refused in [("no client certificate", nats_tls(str(d / "ca.pem"), None, None)),
                              ("plaintext", None)]:
            with self.subTest(what=what), self.assertRaises(Exception):
                asyncio.run(self.connect(self.url if refused else f"nats://127.0.0.1:{self.port}", refused))

    def test_a_worker_takes_the_tls_files_from_the_environment(self):
        import ssl
        from unittest import mock

        from hermes_agents import Worker

        env = {"HERMES_NATS_TLS_CA_FILE": str(self.d / "ca.pem"), "HERMES_NATS_TLS_CERT_FILE": str(self.d / "client.pem"),
               "HERMES_NATS_TLS_KEY_FILE": str(self.d / "client.key")}
        with mock.patch.dict(os.environ, env):
            worker = Worker(agent_id="py-tls", nats_url=self.url)
        self.assertIsInstance(worker.nats_options["tls"], ssl.SSLContext)
        self.assertIsNotNone(asyncio.run(self.connect(self.url, worker.nats_options["tls"])))

    def test_a_connection_that_is_not_tls_is_told_apart(self):
        import nats

        from hermes_agents.worker import _speaks_tls

        async def speaks(url, tls):
            nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False, tls=tls)
            try:
                return _speaks_tls(nc)
            finally:
                await nc.close()

        d = self.d
        tls = nats_tls(str(d / "ca.pem"), str(d / "client.pem"), str(d / "client.key"))
        self.assertTrue(asyncio.run(speaks(self.url, tls)))
        # A server that does not ask for TLS gets a plaintext connection from nats-py even with a
        # TLS context: the Worker refuses it (worker.serve), as the Rust services do.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        plain = subprocess.Popen([NATS_SERVER, "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            self.assertFalse(asyncio.run(speaks(f"nats://127.0.0.1:{port}", tls)))
        finally:
            plain.kill()
            plain.wait()

    def test_a_worker_reconnects_with_renewed_files_and_keeps_its_connection_on_a_broken_pair(self):
        import hashlib
        import json
        import ssl
        import urllib.request

        import nats

        from hermes_agents.worker import TlsFollower

        d = self.d
        mounted = d / "mounted"
        mounted.mkdir(exist_ok=True)
        for name in ("client.pem", "client.key"):
            shutil.copy(d / name, mounted / name)
        ca, cert, key = str(d / "ca.pem"), str(mounted / "client.pem"), str(mounted / "client.key")

        def presented():
            url = f"http://127.0.0.1:{self.monitor}/connz?auth=true"
            connz = json.loads(urllib.request.urlopen(url, timeout=5).read())
            for conn in connz.get("connections") or []:
                if conn.get("name") == "reloading":
                    return (conn.get("tls_peer_certs") or [{}])[0].get("cert_sha256")
            return None

        def sha(name):
            return hashlib.sha256(ssl.PEM_cert_to_DER_cert((d / name).read_text())).hexdigest()

        async def run():
            nc = await nats.connect(self.url, name="reloading", tls=nats_tls(ca, cert, key), connect_timeout=2)
            try:
                follower = TlsFollower(nc, ca, cert, key)
                self.assertFalse(await follower.look(), "nothing changed")
                self.assertEqual(presented(), sha("client.pem"))
                # Renewed: taken by reconnecting, and the server sees the new certificate.
                shutil.copy(d / "renewed.pem", mounted / "client.pem")
                shutil.copy(d / "renewed.key", mounted / "client.key")
                self.assertTrue(await follower.look())
                deadline = time.monotonic() + 10
                while presented() != sha("renewed.pem"):
                    self.assertLess(time.monotonic(), deadline, "the renewed certificate was not presented")
                    await asyncio.sleep(0.1)
                await nc.jetstream().account_info()
                # A certificate beside a key that is not its own: refused, the connection kept.
                reconnects = nc.stats["reconnects"]
                shutil.copy(d / "client.pem", mounted / "client.pem")
                with self.assertLogs("hermes_agents.worker", "ERROR") as logged:
                    self.assertFalse(await follower.look())
                self.assertIn("nats_tls_reload_failed", logged.output[0])
                await asyncio.sleep(0.5)
                self.assertEqual(nc.stats["reconnects"], reconnects)
                self.assertEqual(presented(), sha("renewed.pem"))
                await nc.jetstream().account_info()
            finally:
                await nc.close()

        asyncio.run(run())

    def test_settings_are_checked(self):
        self.assertIsNone(nats_tls(None, None, None))
        with self.assertRaises(errors.InvalidArgument):
            nats_tls(None, str(self.d / "client.pem"), None)
        with self.assertRaises(FileNotFoundError):
            nats_tls(str(self.d / "nope.pem"), None, None)
