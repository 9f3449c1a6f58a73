"""Celery integration (``pip install django-transactional-inbox[celery]``).

Tasks in :mod:`django_inbox.contrib.celery.tasks`; a beat schedule in
:mod:`django_inbox.contrib.celery.schedule`.
"""
