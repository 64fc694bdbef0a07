"""Measurement harness: worker processes, timing rules and the hardware fingerprint.

Submodules are imported explicitly (``collage_ml.measure.hardware``,
``collage_ml.measure.runner``, ...); this package imports nothing itself, so
that importing one of them never pulls in the others' dependencies.
"""
