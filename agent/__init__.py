"""kvagent: per-host node agent for KV-cache offloading over NVMe-oF."""

__version__ = "0.1.0"
