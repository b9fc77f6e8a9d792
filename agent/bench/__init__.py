"""``kvagent bench``: fio on a pool, and whether loading KV beats recomputing it.

- :mod:`.models`: model shapes (built-in table, HuggingFace config.json) and KV bytes/token
- :mod:`.kvmath`: pure load-vs-recompute arithmetic
- :mod:`.fio`: KV-shaped fio jobs, run through a Runner, JSON parsed
- :mod:`.report`: measured reads + models → per-model verdicts
"""
