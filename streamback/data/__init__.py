"""The data stage: the synthetic corpus, sources (FineWeb, local files), tokenizers, token shards."""

import multiprocessing


def worker_pool(processes: int, initializer=None, initargs: tuple = ()):
    """A pool of worker processes, forked where the platform can (workers then need nothing
    re-imported, whatever the caller's main module is), spawned elsewhere."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method).Pool(processes, initializer, initargs)
