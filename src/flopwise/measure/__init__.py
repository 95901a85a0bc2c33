"""Measuring this machine: device detection and peaks, calibration, collective benchmarks."""
