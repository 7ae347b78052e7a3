"""A PEP 517 build backend with no dependencies, for the stand-in engine packages.

It builds a pure-Python wheel of the one package directory named like the
project, with a console script ``<name> = <name>.cli:main``, and a RECORD
with every file's hash, as pip checks it. Copied next to each stand-in
project's ``pyproject.toml`` (``backend-path = ["."]``).
"""

from __future__ import annotations

import base64
import hashlib
import tomllib
import zipfile
from pathlib import Path


def _digest(data: bytes) -> str:
    raw = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={raw},{len(data)}"


def build_wheel(wheel_directory: str, config_settings: object = None,
                metadata_directory: object = None) -> str:
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    dist_info = f"{name}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for path in sorted(Path(name).rglob("*.py")):
        files[path.as_posix()] = path.read_bytes()
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n").encode()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: standin_backend\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n")
    files[f"{dist_info}/entry_points.txt"] = (
        f"[console_scripts]\n{name} = {name}.cli:main\n").encode()
    record = "".join(f"{path},{_digest(data)}\n" for path, data in files.items())
    record += f"{dist_info}/RECORD,,\n"
    filename = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / filename, "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
        wheel.writestr(f"{dist_info}/RECORD", record)
    return filename
