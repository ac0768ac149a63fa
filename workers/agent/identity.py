"""The device's identity in its ``--home``: ``device-key.pem`` (its Ed25519 private key) and
``identity.json`` (the service, the device's name, its bearer token, its SoC), both mode 0600 in a
0700 directory. Made once by ``ctxfarm-agent enroll``; the private key never leaves the device."""

from __future__ import annotations

import base64
import json
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.core.errors import ConfigError, MissingExtraError, UsageError

KEY_FILE = "device-key.pem"
IDENTITY_FILE = "identity.json"
SIMULATOR = "simulator"
FARM_HOSTS = ("x86_64", "amd64", "i386", "i686", "x86")


@dataclass(frozen=True)
class Identity:
    server: str
    name: str
    token: str
    soc: str
    simulator: bool
    key: Any  # an Ed25519PrivateKey

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self.key.sign(data)).decode()


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ModuleNotFoundError:
        raise MissingExtraError("the agent signs its reports with the cryptography package",
                                hint="pip install 'ctxfarm[sign]'") from None
    return serialization, ed25519


def _write_private(path: Path, data: bytes) -> None:
    """A new file, mode 0600 from its first byte, replaced atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def detect(soc: str | None = None) -> tuple[str, dict[str, str]]:
    """(SoC, facts) of this machine: an x86 host is the ``simulator`` (a QNN runtime there is the
    HTP simulator), whatever ``soc`` says; a device's SoC is ``soc`` or Android's ``ro.soc.model``."""
    from workers.backends import qnn_toolchain

    arch = platform.machine() or "unknown"
    facts: dict[str, str] = {"arch": arch, "os": f"{platform.system()} {platform.release()}"[:128]}
    try:
        tc = qnn_toolchain()
        facts |= {"runtime": tc.version, "onnxruntime": tc.ort_version, "ep_package": tc.ep_package,
                  "ep_version": tc.ep_version}
    except Exception:  # noqa: BLE001 - no runtime is a fact too: the agent can take no job
        pass
    if arch.lower() in FARM_HOSTS:
        return SIMULATOR, facts
    if not soc:
        soc = _getprop("ro.soc.model")
    if not soc:
        raise UsageError("which SoC is this device? (no ro.soc.model here)", hint="ctxfarm-agent enroll --soc SM8650 ...")
    return soc, facts


def _getprop(name: str) -> str | None:
    try:
        out = subprocess.run(["getprop", name], capture_output=True, text=True, timeout=5, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[:64] or None


def enroll(server: str, token: str, home: Path, soc: str | None = None) -> dict[str, Any]:
    """Make the key pair, register it with the enrollment token, keep the identity in ``home``."""
    from workers.agent.wire import call, check_server

    server = check_server(server)
    serialization, ed25519 = _crypto()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o700)
    if (home / IDENTITY_FILE).exists():
        raise UsageError(f"{home} already holds an enrolled identity", hint="use another --home, or ctxfarm-agent run")
    soc, facts = detect(soc)
    key = ed25519.Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(serialization.Encoding.Raw,
                                                            serialization.PublicFormat.Raw)).decode()
    _status, answer = call(server, "/v1/devices/enroll", token, {"public_key": public, "soc": soc, "facts": facts})
    if not isinstance(answer, dict) or not all(isinstance(answer.get(k), str) for k in ("name", "token", "soc")):
        from farm.core.errors import ServerError

        raise ServerError("the enrollment answer is not {name, token, soc}")
    _write_private(home / KEY_FILE, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    identity = {"server": server, "name": answer["name"], "token": answer["token"], "soc": answer["soc"],
                "simulator": bool(answer.get("simulator")), "key_id": answer.get("key_id"), "facts": facts}
    _write_private(home / IDENTITY_FILE, json.dumps(identity, indent=2).encode())
    return {k: v for k, v in identity.items() if k != "token"}


def load(home: Path) -> Identity:
    serialization, ed25519 = _crypto()
    try:
        data = json.loads((home / IDENTITY_FILE).read_text())
        key = serialization.load_pem_private_key((home / KEY_FILE).read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--home {home}: no enrolled identity here ({type(exc).__name__})",
                          hint="ctxfarm-agent enroll --server URL --token ENROLLMENT_TOKEN --home DIR") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ConfigError(f"--home {home}: {KEY_FILE} is not an Ed25519 key")
    return Identity(str(data["server"]), str(data["name"]), str(data["token"]), str(data["soc"]),
                    bool(data["simulator"]), key)
