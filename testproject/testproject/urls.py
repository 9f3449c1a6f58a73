from django.contrib import admin
from django.urls import path

from django_inbox.contrib.webhooks import (
    HmacSignature,
    StandardWebhooks,
    StripeSignature,
    webhook_view,
)

#: The test senders' secrets (tests/unit/test_webhook_view.py signs with them).
STANDARD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
GITHUB_SECRET = "It's a Secret to Everybody"
STRIPE_SECRET = "whsec_test_stripe_endpoint_secret"
#: The body limit of hooks/standard/small/ (bytes).
SMALL_LIMIT = 4096

urlpatterns = [
    path("admin/", admin.site.urls),
    path(
        "hooks/standard/",
        webhook_view(consumer="effects", verify=StandardWebhooks(STANDARD_SECRET)),
    ),
    path(
        "hooks/standard/deliver/",
        webhook_view(consumer="effects", verify=StandardWebhooks(STANDARD_SECRET), mode="deliver"),
    ),
    path(
        "hooks/github/",
        webhook_view(
            consumer="effects",
            verify=HmacSignature(
                secret=GITHUB_SECRET,
                header="X-Hub-Signature-256",
                prefix="sha256=",
                id_header="X-GitHub-Delivery",
                event_type_header="X-GitHub-Event",
            ),
        ),
    ),
    path("hooks/stripe/", webhook_view(consumer="effects", verify=StripeSignature(STRIPE_SECRET))),
    path(
        "hooks/standard/async/",
        webhook_view(
            consumer="effects", verify=StandardWebhooks(STANDARD_SECRET), asynchronous=True
        ),
    ),
    path(
        "hooks/standard/async/deliver/",
        webhook_view(
            consumer="effects",
            verify=StandardWebhooks(STANDARD_SECRET),
            mode="deliver",
            asynchronous=True,
        ),
    ),
    path(
        "hooks/standard/small/",
        webhook_view(
            consumer="effects",
            verify=StandardWebhooks(STANDARD_SECRET),
            max_bytes=SMALL_LIMIT,
            asynchronous=True,
        ),
    ),
]
