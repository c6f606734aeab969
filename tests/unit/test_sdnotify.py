"""vpay.worker.sdnotify against real AF_UNIX datagram sockets (no database, no systemd)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

try:
    from vpay.worker import sdnotify
except ImportError:  # the package is not installed: test the checkout itself
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from vpay.worker import sdnotify

Notifier = sdnotify.Notifier
watchdog_interval = sdnotify.watchdog_interval

# sun_path holds 108 bytes including the NUL; long pytest tmp paths can exceed it.
_SUN_PATH_MAX = 100


def _bind_receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


@pytest.fixture
def path_socket(tmp_path):
    """A receiving socket bound to a filesystem path; yields (sock, path)."""
    path = str(tmp_path / "notify.sock")
    short_dir = None
    if len(path) > _SUN_PATH_MAX:
        short_dir = tempfile.mkdtemp(prefix="sdn")
        path = os.path.join(short_dir, "n.sock")
    sock = _bind_receiver(path)
    try:
        yield sock, path
    finally:
        sock.close()
        if short_dir is not None:
            if os.path.exists(path):
                os.unlink(path)
            os.rmdir(short_dir)


@pytest.fixture
def abstract_socket():
    """A receiving socket in Linux's abstract namespace; yields (sock, "@name")."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the abstract socket namespace is Linux-only")
    name = f"vpay-test-sdnotify-{uuid.uuid4().hex}"
    sock = _bind_receiver("\0" + name)
    try:
        yield sock, "@" + name
    finally:
        sock.close()


MESSAGES = [
    pytest.param(lambda n: n.ready(), b"READY=1", id="ready"),
    pytest.param(lambda n: n.ready(status="claiming jobs"), b"READY=1\nSTATUS=claiming jobs", id="ready-status"),
    pytest.param(lambda n: n.status("draining: 3 jobs in flight"), b"STATUS=draining: 3 jobs in flight", id="status"),
    pytest.param(lambda n: n.stopping(), b"STOPPING=1", id="stopping"),
    pytest.param(lambda n: n.stopping(status="draining"), b"STOPPING=1\nSTATUS=draining", id="stopping-status"),
    pytest.param(lambda n: n.watchdog(), b"WATCHDOG=1", id="watchdog"),
    pytest.param(lambda n: n.extend_timeout(45), b"EXTEND_TIMEOUT_USEC=45000000", id="extend-int"),
    pytest.param(lambda n: n.extend_timeout(1.5), b"EXTEND_TIMEOUT_USEC=1500000", id="extend-float"),
    pytest.param(lambda n: n.extend_timeout(4.35), b"EXTEND_TIMEOUT_USEC=4350000", id="extend-rounds"),
    pytest.param(lambda n: n.extend_timeout(-3), b"EXTEND_TIMEOUT_USEC=0", id="extend-negative"),
    pytest.param(lambda n: n.send(READY=1, STATUS="up", MAINPID=42), b"READY=1\nSTATUS=up\nMAINPID=42", id="send"),
    pytest.param(lambda n: n.send(READY=True), b"READY=1", id="send-bool"),
    pytest.param(lambda n: n.status("line one\nREADY=1"), b"STATUS=line one READY=1", id="status-no-newline-injection"),
    pytest.param(lambda n: n.status("réconcilié ✓"), "STATUS=réconcilié ✓".encode(), id="status-utf8"),
    pytest.param(lambda n: n.send_raw("FOO=bar\nBAZ=1\n"), b"FOO=bar\nBAZ=1\n", id="send-raw"),
]


@pytest.mark.parametrize("act, payload", MESSAGES)
def test_path_socket_receives_exact_payload(path_socket, monkeypatch, act, payload):
    sock, path = path_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    notifier = Notifier.from_env()
    assert notifier.enabled
    assert act(notifier) is True
    assert sock.recv(4096) == payload


@pytest.mark.parametrize("act, payload", MESSAGES)
def test_abstract_socket_receives_exact_payload(abstract_socket, act, payload):
    sock, name = abstract_socket
    notifier = Notifier.from_env({"NOTIFY_SOCKET": name})
    assert notifier.enabled
    assert notifier.address == "\0" + name[1:]
    assert act(notifier) is True
    assert sock.recv(4096) == payload


def test_one_datagram_per_call(path_socket):
    sock, path = path_socket
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    notifier.ready()
    notifier.watchdog()
    notifier.stopping()
    assert [sock.recv(4096) for _ in range(3)] == [b"READY=1", b"WATCHDOG=1", b"STOPPING=1"]


def test_send_without_fields_sends_nothing(path_socket):
    sock, path = path_socket
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert notifier.send() is False
    notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"


def test_threads_share_one_notifier(path_socket):
    sock, path = path_socket
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    # Stay under the kernel's default datagram queue length (net.unix.max_dgram_qlen = 10).
    threads = [threading.Thread(target=notifier.status, args=(f"t{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    received = sorted(sock.recv(4096) for _ in threads)
    assert received == sorted(f"STATUS=t{i}".encode() for i in range(8))


@pytest.mark.parametrize("environ", [{}, {"NOTIFY_SOCKET": ""}], ids=["unset", "empty"])
def test_disabled_notifier_opens_no_socket(monkeypatch, environ):
    def no_sockets(*args, **kwargs):
        raise AssertionError("a disabled Notifier opened a socket")

    monkeypatch.setattr(socket, "socket", no_sockets)
    notifier = Notifier.from_env(environ)
    assert not notifier.enabled
    assert notifier.address is None
    assert notifier.ready() is False
    assert notifier.ready(status="x") is False
    assert notifier.status("x") is False
    assert notifier.stopping() is False
    assert notifier.watchdog() is False
    assert notifier.extend_timeout(10) is False
    assert notifier.send(READY=1) is False
    assert notifier.send_raw("READY=1") is False


def test_from_env_defaults_to_process_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not Notifier.from_env().enabled
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "n.sock"))
    assert Notifier.from_env().address == str(tmp_path / "n.sock")


@pytest.mark.parametrize("value", ["relative/path", "@", "vsock:2:1234"])
def test_unsupported_address_disables(value):
    assert not Notifier.from_env({"NOTIFY_SOCKET": value}).enabled


def test_vanished_socket_does_not_raise(tmp_path, caplog):
    path = str(tmp_path / "gone.sock")
    if len(path) > _SUN_PATH_MAX:
        path = os.path.join(tempfile.gettempdir(), f"sdn-{uuid.uuid4().hex[:8]}.sock")
    receiver = _bind_receiver(path)
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert notifier.watchdog() is True
    receiver.close()
    os.unlink(path)

    with caplog.at_level(logging.DEBUG, logger=sdnotify.__name__):
        assert notifier.watchdog() is False
        assert notifier.ready(status="still here") is False
        assert notifier.extend_timeout(5) is False
    failures = [r for r in caplog.records if r.name == sdnotify.__name__ and r.levelno == logging.DEBUG]
    assert len(failures) == 1, "a run of failures is logged once, not per send"
    assert failures[0].exc_info is not None


def test_socket_that_never_existed_does_not_raise():
    notifier = Notifier.from_env({"NOTIFY_SOCKET": f"/nonexistent-{uuid.uuid4().hex}/notify"})
    assert notifier.enabled
    assert notifier.ready() is False


def test_abstract_name_nobody_listens_on_does_not_raise():
    if not sys.platform.startswith("linux"):
        pytest.skip("the abstract socket namespace is Linux-only")
    notifier = Notifier.from_env({"NOTIFY_SOCKET": f"@vpay-test-nobody-{uuid.uuid4().hex}"})
    assert notifier.stopping() is False


def test_failure_logging_rearms_after_a_success(tmp_path, caplog):
    path = str(tmp_path / "flap.sock")
    if len(path) > _SUN_PATH_MAX:
        path = os.path.join(tempfile.gettempdir(), f"sdn-{uuid.uuid4().hex[:8]}.sock")
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    with caplog.at_level(logging.DEBUG, logger=sdnotify.__name__):
        assert notifier.watchdog() is False  # nobody bound yet: logged
        receiver = _bind_receiver(path)
        try:
            assert notifier.watchdog() is True
            assert receiver.recv(4096) == b"WATCHDOG=1"
        finally:
            receiver.close()
            os.unlink(path)
        assert notifier.watchdog() is False  # a new outage: logged again
    failures = [r for r in caplog.records if r.name == sdnotify.__name__]
    assert len(failures) == 2


# -- watchdog_interval -------------------------------------------------------


def test_watchdog_interval_is_half_the_timeout():
    assert watchdog_interval({"WATCHDOG_USEC": "60000000"}) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "1000"}) == 0.0005


def test_watchdog_interval_when_pid_is_ours():
    env = {"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}
    assert watchdog_interval(env) == 30.0


def test_watchdog_interval_when_pid_is_another_process():
    env = {"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid() + 1)}
    assert watchdog_interval(env) is None


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"WATCHDOG_PID": "1"},
        {"WATCHDOG_USEC": ""},
        {"WATCHDOG_USEC": "0"},
        {"WATCHDOG_USEC": "-5"},
        {"WATCHDOG_USEC": "sixty"},
        {"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "not-a-pid"},
    ],
    ids=["unset", "pid-only", "empty", "zero", "negative", "garbage", "garbage-pid"],
)
def test_no_watchdog(env):
    assert watchdog_interval(env) is None


def test_watchdog_interval_defaults_to_process_environment(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "20000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval() == 10.0
    monkeypatch.delenv("WATCHDOG_USEC")
    assert watchdog_interval() is None
