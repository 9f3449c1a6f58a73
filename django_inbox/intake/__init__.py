"""A message's way in: validated (``validation``), made a row (``rows``), delivered and run
at once (``delivery``, ``batches`` for several in one transaction) or stored for the workers
(``storing``)."""
