"""A small library for the Linux kernel NVMe-oF target (nvmet) through configfs."""
