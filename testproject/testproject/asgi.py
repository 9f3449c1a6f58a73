"""The test project's ASGI application (run by uvicorn in the webhook tests and the bench),
with webhook bodies refused past their limit before Django reads them.

``INBOX_TEST_BODY_TIMEOUT`` shortens the time a body may take, so a test of a stalled sender
does not wait the default 30 s."""

import os

from django.core.asgi import get_asgi_application

from django_inbox.contrib.webhooks.asgi import BODY_TIMEOUT, webhook_body_limit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

application = webhook_body_limit(
    get_asgi_application(),
    timeout=float(os.environ.get("INBOX_TEST_BODY_TIMEOUT", BODY_TIMEOUT)),
)
