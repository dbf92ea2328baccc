"""One contract for every Host implementation (LocalHost, FakeHost; SSHHost joins later)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import HostError, HostUnreachable
from orchestrator.hosts.base import Host
from orchestrator.hosts.local import LocalHost
from tests.support.fakehost import FakeHost


@pytest.fixture(params=["local", "fake"])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Host:
    root = tmp_path / "root"
    root.mkdir()
    return LocalHost(root) if request.param == "local" else FakeHost(root)


class TestHostContract:
    def test_run_reports_exit_code_and_output(self, host: Host) -> None:
        ok = host.run(["sh", "-c", 'echo out; echo err >&2; exit 3'])
        assert (ok.exit_code, ok.stdout, ok.stderr) == (3, "out\n", "err\n")

    def test_arguments_are_never_interpreted_by_a_shell(self, host: Host, tmp_path: Path) -> None:
        marker = tmp_path / "pwned"
        value = f"$(touch {marker}); `touch {marker}`; echo 'x\" ;"
        result = host.run(["printf", "%s", value])
        assert result.stdout == value and not marker.exists()

    def test_stdin_reaches_the_command(self, host: Host) -> None:
        assert host.run(["cat"], stdin=b"hello").stdout == "hello"

    def test_missing_program_is_a_transport_level_failure(self, host: Host) -> None:
        with pytest.raises(HostUnreachable):
            host.run(["/nonexistent/program"])

    def test_timeout_is_bounded(self, host: Host) -> None:
        with pytest.raises(HostUnreachable, match="did not finish"):
            host.run(["sleep", "5"], timeout=0.3)

    def test_put_get_round_trip_and_missing_file(self, host: Host, tmp_path: Path) -> None:
        src = tmp_path / "src.bin"
        src.write_bytes(b"\x00\x01payload")
        remote = host.path("sub", "dir", "f.bin")
        host.put(src, remote)
        host.put(src, remote)  # idempotent
        back = tmp_path / "back.bin"
        host.get(remote, back)
        assert back.read_bytes() == src.read_bytes()
        with pytest.raises(HostError):
            host.get(host.path("missing"), tmp_path / "x")


def test_fake_link_cut_raises_unreachable(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path)
    fake.down = True
    with pytest.raises(HostUnreachable, match="link cut"):
        fake.run(["true"])
