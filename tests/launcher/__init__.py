"""Tests of ``guide.launcher``, one file per module of the package."""
