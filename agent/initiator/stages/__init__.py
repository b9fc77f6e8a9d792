"""The stages of the GPU-host pass, each a module with one entry point, in their order.

For each pool :mod:`agent.initiator.reconcile` runs

1. :mod:`.discover` — ``pool_paths``: the pool's subsystems, each at its target
   (configured, or found by ``nvme discover`` at the seeds and the storage hosts their
   referrals name); what the record has at a port that cannot be read carried forward;
   a shared subsystem refused;
2. :mod:`.connect` — ``connect_pool``: every path connected idempotently (recorded
   first: ``PoolAttachment.subsystems``), the controllers' timeouts and the pool's I/O
   policy kept;
3. :mod:`.find` — ``find_devices``: a live controller, then each namespace's block
   device (``PoolAttachment.devices``, each with the directory it is mounted on);
4. :mod:`.layout` — ``pool_volumes``: what gets a filesystem, each namespace or one
   striped volume over them (``PoolAttachment.mounts``);
5. :mod:`.filesystem` — ``make_filesystem``: xfs on a blank device only;
6. :mod:`.mount` — ``mount_volume``: mounted on its directory
   (``PoolAttachment.created_dirs``), recovered after a shutdown, grown, remounted with
   project quotas (``PoolAttachment.recoveries``);
7. :mod:`.handoff` — ``mounted_pool``: what the engines' hand-off
   (:mod:`agent.engines.handoff`, run by :mod:`agent.reconcile`) gets.

The way back is :mod:`.detach` (a pool dropped from the config, or what an earlier
attach did that the config no longer asks for). What the stages share is below them:
:mod:`.context` (the pass's context, the host seams, a volume) and :mod:`.tlskeys`
(the TLS PSK, for a discover and a connect). No stage imports the orchestration, and no
stage imports another.
"""
