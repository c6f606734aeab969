"""The systemd units under systemd/: the settings operators rely on, and
`systemd-analyze verify` when the tool is installed (no database)."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT_DIR = Path(__file__).resolve().parents[2] / "systemd"
WORKER = UNIT_DIR / "vpay-worker@.service"
LANES_WORKER = UNIT_DIR / "vpay-worker-lanes@.service"
API = UNIT_DIR / "vpay-api.service"
TARGET = UNIT_DIR / "vpay.target"
ENV_EXAMPLE = UNIT_DIR / "vpay.env.example"
SERVICES = [WORKER, LANES_WORKER, API]
WORKERS = [WORKER, LANES_WORKER]

# Hardening both services must keep (key -> exact value).
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "RestrictRealtime": "yes",
    "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
}

SECRETS = ("VPAY_MTN_SUBSCRIPTION_KEY", "VPAY_MTN_API_KEY", "VPAY_MTN_DISBURSEMENT_SUBSCRIPTION_KEY",
           "VPAY_MTN_DISBURSEMENT_API_KEY", "VPAY_ORANGE_CLIENT_SECRET", "VPAY_ORANGE_MERCHANT_KEY",
           "VPAY_SECRET_KEYS", "VPAY_SECRET_KEYS_FILE", "VPAY_API_METRICS_TOKEN")
"""Settings that are secrets: systemd credentials in the shipped units, never environment."""

_TIMESPAN_UNITS = {
    "us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3,
    "": 1.0, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
}


def parse_timespan(value: str) -> float:
    """Seconds in a systemd time span ("45", "45s", "1min 30s"); see systemd.time(7)."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value.strip().lower())
    if not parts or re.sub(r"[\d.\sa-z]", "", value.lower()):
        raise ValueError(f"not a time span: {value!r}")
    return sum(float(n) * _TIMESPAN_UNITS[unit] for n, unit in parts)


def load_unit(path: Path) -> configparser.ConfigParser:
    # strict=False: systemd allows a key to repeat; interpolation=None: %i and
    # %H are systemd specifiers, not configparser's.
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(path.read_text(), source=str(path))
    return parser


def exec_start_argv(unit: configparser.ConfigParser) -> list[str]:
    return shlex.split(unit["Service"]["ExecStart"].replace("\\\n", " "))


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


# -- pure Python: always runs --------------------------------------------------


@pytest.mark.parametrize("path", SERVICES, ids=lambda p: p.name)
def test_service_lifecycle_settings(path):
    service = load_unit(path)["Service"]
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert service["KillMode"] == "mixed"
    assert service.get("KillSignal", "SIGTERM") == "SIGTERM"
    assert service["Restart"] == "on-failure"
    assert "78" in service["RestartPreventExitStatus"].split(), "exit 78 (config refused) must not restart"
    assert service["EnvironmentFile"].lstrip("-") == "/etc/vpay/vpay.env"
    assert service["User"] == "vpay"
    assert service["StateDirectory"] == "vpay"
    assert service["WorkingDirectory"] == "/var/lib/vpay"
    assert os.path.isabs(exec_start_argv(load_unit(path))[0])


@pytest.mark.parametrize("path", SERVICES, ids=lambda p: p.name)
def test_service_hardening(path):
    service = load_unit(path)["Service"]
    for key, expected in HARDENING.items():
        assert key in service, f"{path.name} lost {key}="
        assert service[key] == expected, f"{path.name}: {key}={service[key]!r}, want {expected!r}"
    assert set(service["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}


@pytest.mark.parametrize("path", SERVICES, ids=lambda p: p.name)
def test_units_belong_to_the_target(path):
    unit = load_unit(path)
    assert "vpay.target" in unit["Unit"]["PartOf"].split()
    assert "vpay.target" in unit["Install"]["WantedBy"].split()
    assert "network-online.target" in unit["Unit"]["Wants"].split()
    assert {"network-online.target", "postgresql.service"} <= set(unit["Unit"]["After"].split())


@pytest.mark.parametrize("path", WORKERS, ids=lambda p: p.name)
def test_worker_stop_timeout_exceeds_the_drain_grace(path):
    unit = load_unit(path)
    argv = exec_start_argv(unit)
    grace = flag_value(argv, "--shutdown-grace-seconds")
    assert grace is not None, "ExecStart must pass --shutdown-grace-seconds explicitly"
    stop = parse_timespan(unit["Service"]["TimeoutStopSec"])
    assert stop > float(grace), f"TimeoutStopSec={stop}s would SIGKILL a worker still inside its {grace}s grace"


@pytest.mark.parametrize("path", WORKERS, ids=lambda p: p.name)
def test_worker_command_line(path):
    unit = load_unit(path)
    argv = exec_start_argv(unit)
    assert Path(argv[0]).name == "vpay-worker"
    assert "%i" in (flag_value(argv, "--worker-id") or "").lower(), "each replica needs its own worker id"
    assert int(flag_value(argv, "--worker-concurrency")) >= 1


def test_the_replica_template_serves_every_lane_and_the_lanes_template_its_instance():
    assert flag_value(exec_start_argv(load_unit(WORKER)), "--queues") is None
    # %I (unescaped): "vpay-worker-lanes@mtn\x2corange" runs --queues mtn,orange
    assert flag_value(exec_start_argv(load_unit(LANES_WORKER)), "--queues") == "%I"


def test_the_two_worker_templates_differ_only_in_what_names_the_instance():
    """The lanes template is the replica template with --queues: every
    lifecycle and hardening line stays the same in both."""
    def body(path):
        service = dict(load_unit(path)["Service"])
        service.pop("ExecStart")
        service.pop("Environment")  # all its lines compared below
        return service
    assert body(WORKER) == body(LANES_WORKER)
    # the one intended difference: a numbered replica's metrics port (910%i);
    # a lane-set instance has no number to derive one from
    numbered = environment(WORKER)
    assert numbered.pop("VPAY_METRICS_PORT") == "910%i"
    assert numbered == environment(LANES_WORKER)
    assert load_unit(WORKER)["Install"] == load_unit(LANES_WORKER)["Install"]
    plain = exec_start_argv(load_unit(WORKER))
    lanes = exec_start_argv(load_unit(LANES_WORKER))
    assert [a for a in lanes if a not in ("--queues", "%I", "%H:%I")] == \
        [a for a in plain if a != "%H:%i"]


@pytest.mark.parametrize("path", WORKERS, ids=lambda p: p.name)
def test_worker_watchdog(path):
    service = load_unit(path)["Service"]
    assert "WatchdogSec" in service
    assert parse_timespan(service["WatchdogSec"]) > 0
    assert parse_timespan(service["RestartSec"]) > 0


def test_api_unit():
    unit = load_unit(API)
    service = unit["Service"]
    argv = exec_start_argv(unit)
    assert Path(argv[0]).name == "vpay-server"
    assert argv[1] == "api"
    assert flag_value(argv, "--bind") == "127.0.0.1:8080"
    # gunicorn's default graceful_timeout is 30 s.
    assert parse_timespan(service["TimeoutStopSec"]) > 30
    # gunicorn never sends WATCHDOG=1: a watchdog here would kill a healthy API.
    assert parse_timespan(service.get("WatchdogSec", "0")) == 0


def load_credentials(path: Path) -> dict[str, str]:
    """Every ``LoadCredential=ID:PATH`` of a unit (the key may repeat)."""
    lines = [l.partition("=")[2] for l in path.read_text().splitlines() if l.startswith("LoadCredential=")]
    return dict(line.split(":", 1) for line in lines)


@pytest.mark.parametrize("path", SERVICES, ids=lambda p: p.name)
def test_secrets_come_as_credentials_never_as_environment(path):
    # Environment= lines show in `systemctl show` to any local user; a
    # credential is a file only this service's user (and root) can read.
    credentials = load_credentials(path)
    assert credentials["VPAY"] == "/etc/vpay/credentials"  # every file there: VPAY_<file name>
    for name in SECRETS:
        assert name not in environment(path), f"{path.name}: {name} in Environment="
    assert "PassEnvironment" not in load_unit(path)["Service"]


def test_the_workers_and_the_api_get_the_secret_keys_as_a_credential():
    # the workers open sealed secrets to sign; the API seals the secrets
    # merchants register and rotate through /v1/webhook_endpoints
    for path in [*WORKERS, API]:
        assert load_credentials(path)["VPAY_SECRET_KEYS"] == "/etc/vpay/secret-keys"


def test_a_credential_file_named_in_a_unit_reaches_the_code_under_its_variable(tmp_path, monkeypatch):
    """`LoadCredential=VPAY:/etc/vpay/credentials` loads the file MTN_API_KEY
    as `$CREDENTIALS_DIRECTORY/VPAY_MTN_API_KEY` (systemd.exec(5): the ID
    suffixed with "_$FILENAME"): what `vpay.base.credentials` reads."""
    from vpay.base.credentials import lookup
    (tmp_path / "VPAY_MTN_API_KEY").write_text("k\n")
    assert lookup("VPAY_MTN_API_KEY", {"CREDENTIALS_DIRECTORY": str(tmp_path)}) == "k"


def test_target_groups_api_and_replicas():
    unit = load_unit(TARGET)
    wants = unit["Unit"]["Wants"].split()
    assert "vpay-api.service" in wants
    assert {"vpay-worker@1.service", "vpay-worker@2.service"} <= set(wants)
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_env_example_lists_the_contract_variables():
    assignments = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"not KEY=value: {line!r}"
            assignments[key] = value
    assert assignments["VPAY_DATABASE_URL"] == "postgresql://vpay@/vpay?host=/run/postgresql"
    assert assignments["VPAY_PROMPT_TTL_SECONDS"] == "900"
    for key in (
        "VPAY_MTN_BASE_URL",
        "VPAY_MTN_API_USER",
        "VPAY_MTN_TARGET_ENVIRONMENT",
        "VPAY_MTN_CALLBACK_URL",
    ):
        assert assignments.get(key), f"{key} missing from vpay.env.example"
    # The secrets are credentials now: named in the file, never assigned there.
    for name in SECRETS:
        assert name not in assignments, f"{name} is a secret: a credential, not vpay.env"
    text = ENV_EXAMPLE.read_text()
    for credential in ("MTN_SUBSCRIPTION_KEY", "MTN_API_KEY", "ORANGE_CLIENT_SECRET", "ORANGE_MERCHANT_KEY",
                       "API_METRICS_TOKEN"):
        assert f"/etc/vpay/credentials/{credential}" in text or f" {credential}" in text, credential


def test_timespan_parser():
    assert parse_timespan("45") == 45
    assert parse_timespan("45s") == 45
    assert parse_timespan("1min 30s") == 90
    assert parse_timespan("500ms") == 0.5
    with pytest.raises(ValueError):
        parse_timespan("soon!")


# -- systemd-analyze verify: only where the tool exists ------------------------

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def _stand_in_executable() -> str:
    # ExecStart binaries are checked for existence; the real ones are not
    # installed on a test machine. The command is never run.
    return "/bin/true" if os.access("/bin/true", os.X_OK) else sys.executable


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed (apt-get install systemd); unit syntax still checked by the pure-Python tests")
def test_systemd_analyze_verify(tmp_path):
    stand_in = _stand_in_executable()
    for src in (WORKER, LANES_WORKER, API, TARGET):
        text = src.read_text()
        text = re.sub(r"^(ExecStart=)(\S+)", lambda m: m.group(1) + stand_in, text, flags=re.M)
        (tmp_path / src.name).write_text(text)
    # A template is verified through an instance; a symlink named like one is
    # how systemd finds the template for it.
    for n in (1, 2):
        (tmp_path / f"vpay-worker@{n}.service").symlink_to("vpay-worker@.service")
    lane_sets = ["vpay-worker-lanes@mtn.service", "vpay-worker-lanes@mtn\\x2corange.service"]
    for name in lane_sets:
        (tmp_path / name).symlink_to("vpay-worker-lanes@.service")

    names = ["vpay-worker@1.service", "vpay-worker@2.service", *lane_sets, "vpay-api.service",
             "vpay.target"]
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", *[str(tmp_path / n) for n in names]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = (proc.stdout + proc.stderr).strip()
    # Unknown keys and unparsable values are only warnings (exit 0): fail on
    # any line about our units too.
    markers = [str(tmp_path), *names, "vpay-worker@.service", "vpay-worker-lanes@.service"]
    ours = [line for line in output.splitlines() if any(m in line for m in markers)]
    assert proc.returncode == 0 and not ours, f"systemd-analyze verify (exit {proc.returncode}):\n{output}"


def environment(path: Path) -> dict[str, str]:
    """Every ``Environment=`` assignment of a unit: systemd accumulates the
    lines, configparser would keep only the last."""
    lines = [l.partition("=")[2] for l in path.read_text().splitlines() if l.startswith("Environment=")]
    return dict(a.split("=", 1) for line in lines for a in shlex.split(line))


def test_each_worker_replica_gets_its_own_metrics_port():
    assignments = environment(WORKER)
    assert assignments["VPAY_METRICS_PORT"] == "910%i"
    for n in range(1, 10):
        assert 1024 < int(assignments["VPAY_METRICS_PORT"].replace("%i", str(n))) < 65536
    assert "--metrics-port" not in exec_start_argv(load_unit(WORKER))  # the flag would beat a drop-in
    env_lines = [l for l in ENV_EXAMPLE.read_text().splitlines() if not l.startswith("#")]
    assert not any(l.startswith("VPAY_METRICS_PORT") for l in env_lines)  # one port for every replica


@pytest.mark.skipif(shutil.which("systemd-escape") is None, reason="systemd-escape not installed")
def test_a_lane_set_instance_name_round_trips_to_a_queues_value_the_worker_accepts():
    import vpay.money  # noqa: F401  (the domain registers the rail lanes; alone, only housekeeping exists)
    from vpay.engine.lanes import parse_queues
    escaped = subprocess.run([shutil.which("systemd-escape"), "--template", "vpay-worker-lanes@.service",
                              "mtn,orange"], capture_output=True, text=True, check=True).stdout.strip()
    assert escaped == r"vpay-worker-lanes@mtn\x2corange.service"  # as README.md and the unit say
    instance = escaped.split("@", 1)[1].removesuffix(".service")
    unescaped = subprocess.run([shutil.which("systemd-escape"), "--unescape", instance],
                               capture_output=True, text=True, check=True).stdout.strip()  # what %I gives
    assert parse_queues(unescaped) == ("mtn", "orange")


def test_the_api_docs_say_it_is_safe_bare_and_name_its_limits():
    # Issue #27: waitress in each worker holds slow clients without a thread;
    # a buffering proxy is no longer required, and the docs must not say it is.
    root = Path(__file__).resolve().parents[2]
    for doc in (root / "systemd" / "README.md", root / "docs" / "api.md"):
        text = " ".join(doc.read_text(encoding="utf-8").split())
        assert "proxy_request_buffering" not in text and "(required)" not in text, doc
        assert "VPAY_HTTP_MAX_CONNECTIONS_PER_ADDRESS=0" in text, doc
    security = (root / "docs" / "security.md").read_text(encoding="utf-8")
    for name in ("VPAY_HTTP_HEADER_TIMEOUT_SECONDS", "VPAY_HTTP_BODY_TIMEOUT_SECONDS",
                 "VPAY_HTTP_IDLE_TIMEOUT_SECONDS", "VPAY_HTTP_MAX_CONNECTIONS_PER_ADDRESS",
                 "VPAY_HTTP_MAX_CONNECTIONS"):
        assert f"`{name}`" in security, name
