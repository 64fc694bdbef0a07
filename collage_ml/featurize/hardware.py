"""Hardware descriptors, the part of every feature row that says where a candidate runs.

A :class:`HardwareDesc` has two parts:

- **static**: cores, threads, GPU presence and the ISA flags that change which
  kernels a backend can use (:data:`ISA_FLAGS`, from the fingerprint's
  ``isa``); cache sizes are recorded by ``hardware_info`` but are not features
  yet, because the shipped datasets do not all carry them;
- **measured**: the probe set's latencies on this machine, per backend
  (:mod:`collage_ml.measure.probes`), in :func:`~collage_ml.measure.probes.probe_names`
  order, ``None`` where a backend cannot run a probe. A descriptor without
  probes (``probes == ()``) is a machine that was never calibrated; its probe
  features are missing (NaN), which XGBoost handles natively and the GNN masks.

It is frozen and hashable (feature caches key on it), and travels in model
artifacts as plain JSON (:meth:`to_json` / :meth:`from_json`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

#: ISA flags the features read, as ``hardware_info()["isa"]`` names them
ISA_FLAGS: tuple[str, ...] = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx")


@dataclass(frozen=True)
class HardwareDesc:
    cores: int
    threads: int
    gpu: bool
    isa: tuple[str, ...] = ()
    #: ((backend name, (seconds or None per probe, in probe_names() order)), ...), sorted by backend
    probes: tuple[tuple[str, tuple[float | None, ...]], ...] = ()

    @staticmethod
    def from_info(
        info: Mapping[str, Any] | None, threads: int | None = None,
        probes: Mapping[str, Mapping[str, float | None]] | None = None,
    ) -> "HardwareDesc":
        """From a hardware description (``measure.hardware.hardware_info`` or the DB's ``hardware`` table),
        plus the probe results ``{backend: {probe name: seconds or None}}`` where there are any."""
        info = info or {}
        cores = int(info.get("physical_cores") or info.get("logical_cores") or 1)
        t = int(threads or info.get("threads") or cores)
        isa_info = info.get("isa") or {}
        isa = tuple(f for f in ISA_FLAGS if isa_info.get(f))
        return HardwareDesc(cores=cores, threads=t, gpu=bool(info.get("gpus")), isa=isa).with_probes(probes)

    @staticmethod
    def current(threads: int | None = None) -> "HardwareDesc":
        """This machine, without probes (see :meth:`with_probes`)."""
        from collage_ml.measure.hardware import hardware_info
        from collage_ml.paths import default_threads

        t = threads or default_threads()
        return HardwareDesc.from_info(hardware_info(t), t)

    def with_probes(self, probes: Mapping[str, Mapping[str, float | None]] | None) -> "HardwareDesc":
        """A copy carrying ``{backend: {probe name: seconds or None}}`` (probes of another set are dropped)."""
        if not probes:
            return replace(self, probes=())
        from collage_ml.featurize.roofline import PROBE_NAMES as names

        rows = []
        for backend in sorted(probes):
            got = probes[backend] or {}
            vals = tuple(_opt_pos(got.get(n)) for n in names)
            if any(v is not None for v in vals):
                rows.append((backend, vals))
        return replace(self, probes=tuple(rows))

    def probes_of(self, backend: str) -> tuple[float | None, ...] | None:
        """The probe latencies of ``backend`` on this machine: its own, else those of the backend it
        configures (``onnxruntime[spin=on]`` -> ``onnxruntime``); None when it was not calibrated."""
        table = dict(self.probes)
        if backend in table:
            return table[backend]
        return table.get(backend.split("[", 1)[0])

    @property
    def calibrated(self) -> bool:
        return bool(self.probes)

    def static_vector(self) -> list[float]:
        """cores, threads, GPU, then one 0/1 per :data:`ISA_FLAGS`."""
        return [float(self.cores), float(self.threads), float(self.gpu), *(float(f in self.isa) for f in ISA_FLAGS)]

    def describe(self) -> str:
        isa = ",".join(self.isa) or "no listed ISA extensions"
        cal = f"probes for {', '.join(b for b, _ in self.probes)}" if self.probes else "no probes"
        return f"{self.cores} cores, {self.threads} threads{', GPU' if self.gpu else ''}, {isa}; {cal}"

    # -- artifacts ------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "cores": self.cores, "threads": self.threads, "gpu": self.gpu, "isa": list(self.isa),
            "probes": {b: list(v) for b, v in self.probes},
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "HardwareDesc":
        """The inverse of :meth:`to_json`; raises ValueError on anything else."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a hardware descriptor must be a JSON object, not {type(d).__name__}")
        try:
            isa = tuple(str(f) for f in d.get("isa") or ())
            probes = d.get("probes") or {}
            if not isinstance(probes, Mapping):
                raise ValueError("probes must be an object")
            rows = tuple(
                (str(b), tuple(_opt_pos(v) for v in vals)) for b, vals in sorted(probes.items())
            )
            return HardwareDesc(cores=int(d["cores"]), threads=int(d["threads"]), gpu=bool(d["gpu"]), isa=isa,
                                probes=rows)
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a hardware descriptor: {e}") from None


def _opt_pos(v: Any) -> float | None:
    """A positive finite float, or None."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f > 0 and math.isfinite(f) else None


def calibrated(runner, backends, progress: bool = False, say=None) -> HardwareDesc:
    """The runner's machine with the probe results of ``backends``: read from the runner's database, and
    measured first (once per machine and backend, with a progress bar) where it has none."""
    from collage_ml.measure.probes import ensure_probes

    table = ensure_probes(runner, list({b.name: b for b in backends}.values()), progress=progress, say=say)
    return HardwareDesc.current(runner.threads).with_probes(table)
