"""Ordered consumers: a key's lock and applied sequence (``ordering``), a worker's decision for
a claimed version (``holding``), when a waiting version is looked at again (``waits``), gaps
(``gaps``) and the end of a re-run (``rebuilds``)."""
