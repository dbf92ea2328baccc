"""An https ``[data]`` entry fetched by the host (orchestrator/transfer/datasync.py's ``DATA`` script, run as
a host runs it: ``python -I -c DATA ROOT fetch``): over real TLS from a loopback server whose certificate
the host's Python is told to trust (``SSL_CERT_FILE``), verified against the gpuq.toml's sha256, resumed
with a Range request, and refused when the bytes or the certificate are wrong."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from orchestrator.queue.datasets import _url
from orchestrator.transfer.datasync import DATA

BODY = os.urandom(3 * 1024 * 1024 + 17)
SHA = hashlib.sha256(BODY).hexdigest()


class _Handler(http.server.BaseHTTPRequestHandler):
    ranges: ClassVar[list[str]] = []  # the Range header of each request, in order

    def do_GET(self) -> None:
        want = self.headers.get("Range")
        type(self).ranges.append(want or "")
        start = int(want.split("=", 1)[1].rstrip("-")) if want else 0
        if start >= len(BODY):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(BODY)}")
            self.end_headers()
            return
        part = BODY[start:]
        self.send_response(206 if want else 200)
        if want:
            self.send_header("Content-Range", f"bytes {start}-{len(BODY) - 1}/{len(BODY)}")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """https://127.0.0.1:PORT/ with a self-signed certificate for 127.0.0.1; yields (base URL, cert)."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{httpd.server_address[1]}", cert
    finally:
        httpd.shutdown()
        httpd.server_close()


def _host(root: Path, verb: str, url: str, sha: str, cert: Path | None) -> subprocess.CompletedProcess[str]:
    m = _url(root / "gpuq.toml", "weights", {"url": url, "sha256": sha})
    dumped = m.model_dump(mode="json")
    doc = {k: dumped[k] for k in ("name", "tree", "kind", "entries")}
    doc["source"] = url
    env = {"PATH": os.environ["PATH"]}
    if cert is not None:
        env["SSL_CERT_FILE"] = str(cert)
    return subprocess.run([sys.executable, "-I", "-c", DATA, str(root), verb], input=json.dumps(doc), text=True,
                          capture_output=True, env=env, timeout=60, check=False)


def _data(root: Path) -> Path:
    return root / "bundles" / ".data"


def test_a_fetch_is_verified_and_becomes_a_read_only_tree(server: tuple[str, Path], tmp_path: Path) -> None:
    url, cert = server
    done = _host(tmp_path, "fetch", f"{url}/w.bin", SHA, cert)
    assert done.returncode == 0, done.stderr
    (tree,) = (_data(tmp_path) / "trees").iterdir()
    assert (tree / "w.bin").read_bytes() == BODY
    assert not os.access(tree / "w.bin", os.W_OK) or os.geteuid() == 0  # 0444 (root writes anyway)
    assert oct((tree / "w.bin").stat().st_mode & 0o777) == oct(0o444)
    need = _host(tmp_path, "need", f"{url}/w.bin", SHA, cert)
    assert json.loads(need.stdout)["tree"] is True


def test_a_fetch_cut_halfway_resumes_with_a_range_request(server: tuple[str, Path], tmp_path: Path) -> None:
    url, cert = server
    fetch = _data(tmp_path) / "fetch"
    fetch.mkdir(parents=True)
    half = len(BODY) // 2
    (fetch / f"{SHA}.part").write_bytes(BODY[:half])
    _Handler.ranges.clear()
    done = _host(tmp_path, "fetch", f"{url}/w.bin", SHA, cert)
    assert done.returncode == 0, done.stderr
    assert _Handler.ranges == [f"bytes={half}-"]
    assert (_data(tmp_path) / "files" / SHA).read_bytes() == BODY


def test_a_fetch_that_died_after_the_last_byte_finishes_without_downloading_again(server: tuple[str, Path],
                                                                                  tmp_path: Path) -> None:
    """The whole file is in the .part (the fetch died before its sha256 check): the server answers the
    Range request with 416; the host checks what it has instead of failing on every retry."""
    url, cert = server
    fetch = _data(tmp_path) / "fetch"
    fetch.mkdir(parents=True)
    (fetch / f"{SHA}.part").write_bytes(BODY)
    done = _host(tmp_path, "fetch", f"{url}/w.bin", SHA, cert)
    assert done.returncode == 0, done.stderr
    assert (_data(tmp_path) / "files" / SHA).read_bytes() == BODY


def test_bytes_that_are_not_the_declared_sha256_are_refused_and_dropped(server: tuple[str, Path],
                                                                        tmp_path: Path) -> None:
    url, cert = server
    wrong = "0" * 64
    done = _host(tmp_path, "fetch", f"{url}/w.bin", wrong, cert)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == f"{url}/w.bin: the download's sha256 is not {wrong}"
    assert not list((_data(tmp_path) / "files").iterdir()) and not list((_data(tmp_path) / "trees").iterdir())
    assert not list((_data(tmp_path) / "fetch").iterdir())  # the next try starts over


def test_a_certificate_the_host_does_not_trust_is_refused(server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = server
    done = _host(tmp_path, "fetch", f"{url}/w.bin", SHA, None)
    assert done.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in done.stderr, done.stderr
    assert not list((_data(tmp_path) / "files").iterdir())
