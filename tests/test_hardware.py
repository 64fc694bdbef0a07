"""The hardware description and fingerprint."""

from __future__ import annotations

import os
import re
import stat

import pytest

from collage_ml.measure import hardware

FIELDS = {
    "cpu_model",
    "cpu_id",
    "physical_cores",
    "logical_cores",
    "cpus_available",
    "threads",
    "memory_gib",
    "isa",
    "gpus",
    "gpu_name",
    "gpu_driver",
    "os",
    "os_release",
    "arch",
    "fingerprint",
}


@pytest.fixture
def fresh_cache():
    hardware.clear_cache()
    yield
    hardware.clear_cache()


def test_info_has_documented_fields():
    info = hardware.hardware_info(2)
    assert FIELDS <= set(info)
    assert info["threads"] == 2
    assert isinstance(info["cpu_model"], str) and info["cpu_model"]
    assert 1 <= info["physical_cores"] <= info["logical_cores"]
    assert isinstance(info["memory_gib"], int) and info["memory_gib"] >= 1
    assert {"avx2", "avx512f", "amx"} <= set(info["isa"])
    assert all(v in (True, False, None) for v in info["isa"].values())
    assert isinstance(info["gpus"], list)
    assert info["arch"] and info["os"]
    assert info["fingerprint"] == hardware.fingerprint(2)
    info["cpu_model"] = "changed"  # callers get a copy
    assert hardware.hardware_info(2)["cpu_model"] != "changed"


def test_fingerprint_stable_and_keyed_by_threads():
    a = hardware.fingerprint(2)
    assert a == hardware.fingerprint(2)
    assert re.fullmatch(r"cpu-[a-z0-9-]+-t2-[0-9a-f]{12}", a)
    assert hardware.fingerprint(1) != a
    assert hardware.fingerprint(4) != a
    assert hardware.fingerprint_of(hardware.hardware_info(2)) == a
    with pytest.raises(ValueError):
        hardware.fingerprint(0)


def test_fingerprint_covers_exactly_the_documented_fields():
    base = hardware.hardware_info(2)
    fp = hardware.fingerprint_of(base)
    # every "other value" is derived from this machine's own, so it differs on any machine
    gpus = list(base["gpus"] or [])
    other_gpu = {"name": "other-" + (gpus[0]["name"] if gpus else "gpu"), "driver": "other-driver"}
    changed = {
        "cpu_model": base["cpu_model"] + " (other)",
        "cpu_id": f"other-{base['cpu_id']}",
        "isa": {**(base["isa"] or {}), "avx512f": not (base["isa"] or {}).get("avx512f")},
        "physical_cores": base["physical_cores"] + 1,
        "threads": base["threads"] + 1,
        "memory_gib": base["memory_gib"] + 1,
        "gpus": gpus + [other_gpu],
    }
    assert set(changed) == set(hardware.FINGERPRINT_FIELDS)
    for k, v in changed.items():
        assert v != base[k], k
        assert hardware.fingerprint_of({**base, k: v}) != fp, k
    g1 = {**base, "gpus": [other_gpu]}
    g2 = {**base, "gpus": [{**other_gpu, "driver": other_gpu["driver"] + "-2"}]}
    assert hardware.fingerprint_of(g1) != hardware.fingerprint_of(g2)
    for k, v in {"os_release": "other", "logical_cores": 999, "cpus_available": 1, "arch": "z"}.items():
        assert hardware.fingerprint_of({**base, k: v}) == fp, k
    with pytest.raises(ValueError):
        hardware.fingerprint_of({"cpu_model": "x"})


def test_slugs():
    assert hardware._slug("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz") == "intel-xeon-platinum-8480"
    assert hardware._slug("AMD EPYC 7B13 64-Core Processor") == "amd-epyc-7b13"
    assert hardware._slug("") == "unknown"


def _fake_nvidia_smi(tmp_path, body: str):
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


def test_gpu_from_nvidia_smi(tmp_path, monkeypatch, fresh_cache):
    _fake_nvidia_smi(tmp_path, 'echo "NVIDIA H200, 570.86.15"; echo "NVIDIA H200, 570.86.15"')
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    info = hardware.hardware_info(2)
    assert info["gpus"] == [{"name": "NVIDIA H200", "driver": "570.86.15"}] * 2
    assert info["gpu_name"] == "NVIDIA H200" and info["gpu_driver"] == "570.86.15"


@pytest.mark.parametrize("body", ["exit 9", "echo garbage", "kill -SEGV $$"])
def test_broken_nvidia_smi_never_fails(tmp_path, monkeypatch, fresh_cache, body):
    _fake_nvidia_smi(tmp_path, body)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    info = hardware.hardware_info(2)
    assert info["gpus"] == [] and info["gpu_name"] is None and info["gpu_driver"] is None


def test_no_nvidia_smi(monkeypatch, fresh_cache):
    monkeypatch.setattr(hardware.shutil, "which", lambda name: None)
    info = hardware.hardware_info(1)
    assert info["gpus"] == [] and info["gpu_name"] is None
