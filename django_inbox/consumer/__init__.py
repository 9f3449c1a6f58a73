"""Moved to :mod:`django_inbox.broker`; kept so that existing ``INBOX_ENVELOPE`` paths work."""
