"""A stored row's run: claimed (``claims``, ``takeover`` for rows whose worker died), attempted
in the handler's transaction (``attempts``, ``commits``), its state changed under its lease
(``leases``), given back unrun (``giving_back``, ``interruptions``), retried by the one
failure policy (``retry``); the ``inbox_process`` loop (``worker``, ``shutdown``)."""
