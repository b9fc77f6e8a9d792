"""Stand-in for Triton (a GPU kernel compiler, ~1 GB, not installable usefully without a GPU).

Why: ``sglang/srt/utils/common.py`` does ``import triton`` at module level and then
``setattr(triton, "next_power_of_2", ...)``; the modules the SGLang checker runs
(``server_args``, ``environ``, ``arg_groups.hicache_hook``,
``mem_cache/storage/file/lru_file_evictor``) reach it through ``human_readable_int`` and
friends, and none of them runs a Triton kernel. An empty package is all they need. It is
never on the path of a real GPU host, where Triton is installed with SGLang.
"""
