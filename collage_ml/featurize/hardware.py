"""Hardware descriptors, the part of every feature row that says where a candidate runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class HardwareDesc:
    cores: int
    threads: int
    gpu: bool

    @staticmethod
    def from_info(info: Mapping[str, Any] | None, threads: int | None = None) -> "HardwareDesc":
        """From a hardware description (``measure.hardware.hardware_info`` or the DB's ``hardware`` table)."""
        info = info or {}
        cores = int(info.get("physical_cores") or info.get("logical_cores") or 1)
        t = int(threads or info.get("threads") or cores)
        return HardwareDesc(cores=cores, threads=t, gpu=bool(info.get("gpus")))

    @staticmethod
    def current(threads: int | None = None) -> "HardwareDesc":
        from collage_ml.measure.hardware import hardware_info
        from collage_ml.paths import default_threads

        t = threads or default_threads()
        return HardwareDesc.from_info(hardware_info(t), t)

    def vector(self) -> list[float]:
        return [float(self.cores), float(self.threads), float(self.gpu)]
