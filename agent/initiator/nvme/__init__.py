"""nvme-cli and the kernel's ``/dev/nvme-fabrics``, one module per job.

- :mod:`.output`: what nvme-cli prints, read tolerantly (JSON found and read leniently);
- :mod:`.discovery`: ``nvme discover`` and its log page records;
- :mod:`.options`: the connect options (:class:`~.options.FabricsOptions`), the check
  that no value adds options of its own, and the ``/dev/nvme-fabrics`` writer command;
- :mod:`.failures`: why a connect or discover failed (typed errors from nvme-cli's text
  and the kernel's lines), and the fabrics command run that raises them;
- :mod:`.kmsg`: the kernel log lines a fabrics command made;
- :mod:`.controllers`: a controller (a first or a further one) through
  ``/dev/nvme-fabrics``, ``nvme disconnect``;
- :mod:`.listing`: ``nvme list-ns`` (a controller's active namespaces);
- :mod:`.cli`: :class:`~.cli.NvmeCli`, all of them as one object over a runner (what the
  initiator's steps are given, and what tests replace).
"""
