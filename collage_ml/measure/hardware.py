"""What machine a measurement was taken on: a description and a stable fingerprint.

:func:`hardware_info` describes the machine (for the database's ``hardware``
table and dataset READMEs). :func:`fingerprint` condenses the fields that
change latencies into a short id, which keys every measurement: data from
another machine is kept separately, never silently mixed in.

The fingerprint covers exactly :data:`FINGERPRINT_FIELDS`:

- ``cpu_model``: the CPU model string (``/proc/cpuinfo`` "model name", or the
  platform's processor name);
- ``cpu_id``: vendor, family, model and stepping from ``/proc/cpuinfo``; VMs
  often report only a generic model name ("AMD EPYC"), and this tells a
  Zen 3 from a Zen 4 behind it;
- ``isa``: the ISA flags of interest (AVX2, AVX-512, AMX, ...), which the
  hypervisor may mask even on the same CPU;
- ``physical_cores``: physical cores of the machine (psutil);
- ``threads``: the thread count every backend was fixed to;
- ``memory_gib``: total memory, rounded to whole GiB;
- ``gpus``: name and driver version of every NVIDIA GPU ``nvidia-smi`` lists,
  in its order (an empty list when there is none).

It leaves out what does not change latencies or changes without the hardware
changing: the host name, OS release, Python version, logical core count, CPU
affinity. Software versions
are not part of it either: they are keyed separately (backend version, and the
``versions`` of each measurement).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from typing import Any

FINGERPRINT_FIELDS = ("cpu_model", "cpu_id", "isa", "physical_cores", "threads", "memory_gib", "gpus")

# ISA flags of interest, as /proc/cpuinfo names them; "amx" is true when any amx_* flag is present.
_ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx", "asimd", "sve")

_NVIDIA_SMI_TIMEOUT_S = 10.0


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _cpuinfo_field(text: str, *names: str) -> str | None:
    for name in names:
        m = re.search(rf"^{re.escape(name)}\s*:\s*(.+)$", text, re.MULTILINE)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return None


def _cpu_model(cpuinfo: str) -> str:
    model = _cpuinfo_field(cpuinfo, "model name", "Model", "Hardware", "cpu model", "Processor")
    if not model and platform.system() == "Darwin":
        try:
            model = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
        except Exception:
            model = None
    model = model or platform.processor() or platform.machine() or "unknown"
    return " ".join(model.split())


def _isa(cpuinfo: str) -> dict[str, bool | None]:
    flags_line = _cpuinfo_field(cpuinfo, "flags", "Features")
    if flags_line is None:
        return {name: None for name in _ISA_FLAGS}
    flags = set(flags_line.split())
    out: dict[str, bool | None] = {name: name in flags for name in _ISA_FLAGS}
    out["amx"] = any(f.startswith("amx") for f in flags)
    return out


def _gpus() -> list[dict[str, str]]:
    """NVIDIA GPUs as ``[{"name", "driver"}]``; empty when nvidia-smi is missing or fails. Never raises."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
        )
    except Exception:
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0]:
            gpus.append({"name": ",".join(parts[:-1]).strip(), "driver": parts[-1]})
    return gpus


@functools.lru_cache(maxsize=1)
def _static_info() -> dict[str, Any]:
    """Everything except the thread count; probed once per process."""
    cpuinfo = _read_cpuinfo()
    logical = os.cpu_count() or 1
    physical = None
    memory_gib = None
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
        memory_gib = int(round(psutil.virtual_memory().total / 2**30))
    except Exception:
        pass
    if memory_gib is None:
        try:
            memory_gib = int(round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30))
        except (ValueError, OSError, AttributeError):
            memory_gib = 0
    try:
        available = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        available = logical
    gpus = _gpus()
    return {
        "cpu_model": _cpu_model(cpuinfo),
        "cpu_id": "-".join(
            str(_cpuinfo_field(cpuinfo, k) or "?") for k in ("vendor_id", "cpu family", "model", "stepping")
        ),
        "physical_cores": int(physical or logical),
        "logical_cores": int(logical),
        "cpus_available": int(available),
        "memory_gib": memory_gib,
        "isa": _isa(cpuinfo),
        "gpus": gpus,
        "gpu_name": gpus[0]["name"] if gpus else None,
        "gpu_driver": gpus[0]["driver"] if gpus else None,
        "os": platform.system(),
        "os_release": platform.release(),
        "arch": platform.machine(),
    }


def _check_threads(threads: int) -> int:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    return threads


def hardware_info(threads: int) -> dict[str, Any]:
    """Describe this machine, measured with ``threads`` threads. Never fails on a missing GPU or tool.

    Keys: ``cpu_model``, ``physical_cores``, ``logical_cores``, ``cpus_available``
    (CPU affinity of this process), ``threads``, ``memory_gib`` (total, whole GiB),
    ``isa`` (``{"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx", "asimd", "sve"}``
    -> bool, or None where the flags cannot be read), ``gpus`` (list of
    ``{"name", "driver"}``), ``gpu_name`` and ``gpu_driver`` (of the first GPU, or
    None), ``os``, ``os_release``, ``arch``, and ``fingerprint``.
    """
    info = json.loads(json.dumps(_static_info()))  # a deep copy the caller may change
    info["threads"] = _check_threads(threads)
    info["fingerprint"] = fingerprint_of(info)
    return info


def _slug(model: str, limit: int = 24) -> str:
    s = model.lower()
    s = re.sub(r"\((r|tm|c)\)", " ", s)
    s = s.split("@")[0]
    s = re.sub(r"\b(cpu|processor|with radeon graphics|\d+-core)\b", " ", s)
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    if len(s) > limit:
        s = s[:limit].rsplit("-", 1)[0] if "-" in s[:limit] else s[:limit]
    return s or "unknown"


def fingerprint_of(info: dict[str, Any]) -> str:
    """The fingerprint of a :func:`hardware_info` dict: ``cpu-<model-slug>-t<threads>-<12 hex>``.

    The hex digest is a SHA-256 over :data:`FINGERPRINT_FIELDS` only.
    """
    missing = [k for k in FINGERPRINT_FIELDS if k not in info]
    if missing:
        raise ValueError(f"hardware info lacks the fingerprint fields {missing}")
    gpus = [{"name": str(g.get("name", "")), "driver": str(g.get("driver", ""))} for g in info["gpus"] or []]
    payload = {
        "cpu_model": str(info["cpu_model"]),
        "cpu_id": str(info["cpu_id"]),
        "isa": {k: info["isa"][k] for k in sorted(info["isa"] or {})},
        "physical_cores": int(info["physical_cores"]),
        "threads": int(info["threads"]),
        "memory_gib": int(info["memory_gib"]),
        "gpus": gpus,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]
    return f"cpu-{_slug(payload['cpu_model'])}-t{payload['threads']}-{digest}"


@functools.lru_cache(maxsize=None)
def fingerprint(threads: int) -> str:
    """This machine's fingerprint for measurements taken with ``threads`` threads (cached per process)."""
    return hardware_info(threads)["fingerprint"]


@functools.lru_cache(maxsize=1)
def node_id() -> str:
    """Which machine, and which boot of it, is measuring: Linux's boot id (``/proc/sys/kernel/random/boot_id``,
    new at every boot), else the host name. The fingerprint names a kind of machine; two VMs of one kind, or
    one VM before and after a reboot, share it and still run at speeds a few percent apart. Rows and
    calibrations carry this id, so a row is read against its own machine's calibration even where several
    machines of one kind measured at the same time (``collect --ray``)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        if boot:
            return f"boot:{boot}"
    except OSError:
        pass
    return f"host:{platform.node() or 'unknown'}"


def clear_cache() -> None:
    """Forget the probed machine description (for tests, or after the hardware visible to us changed)."""
    _static_info.cache_clear()
    fingerprint.cache_clear()
    node_id.cache_clear()
