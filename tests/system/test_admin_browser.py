"""The admin in a real browser: Playwright drives Debian's Chromium against a live server.

An operator logs in through the login form, reads the health summary and the problem banner,
filters the dead messages, reads a dead message's payload (escaped) and its error history,
replays it through the confirmation page, and sees it completed once a real ``inbox_process``
worker has run: its effect written exactly once. A view-only user sees no action and no
payload, and a forged action POST changes nothing.

Screenshots of the pages are saved under ``docs/images/`` for the documentation when they are
missing; to refresh them, run this file with ``INBOX_SCREENSHOTS=update``.

Chromium comes from Debian (``scripts/test`` installs it with ``ensure_chromium``); the
``playwright`` Python package from the ``test`` extra. ``playwright install`` is never run.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from effects.models import Effect

from django_inbox import Outcome, deliver
from django_inbox.models import InboxMessage
from django_inbox.registry import registry
from django_inbox.services import process_due
from tests.conftest import ROOT, handler
from tests.effects import effect_counts, lost_and_doubled

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

Status = InboxMessage.Status
Manage = Callable[..., subprocess.Popen[str]]

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
IMAGES = ROOT / "docs" / "images"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Generous: the machine is small and shared. A wait that ends early costs nothing.
TIMEOUT_MS = 30_000
PASSWORD = "correct horse battery staple"
OPERATOR_PERMISSIONS = [
    "view_inboxmessage",
    "replay_inboxmessage",
    "park_inboxmessage",
    "retry_inboxmessage",
    "view_payload_inboxmessage",
]
XSS_NOTE = "<script>alert(1)</script>"


def _missing() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (scripts/test installs Debian's chromium package)"
    return ""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    missing = _missing()
    if missing:
        if os.environ.get("CI"):  # CI installs both: a skip there would hide a broken setup
            pytest.fail(f"browser tests cannot run in CI: {missing}", pytrace=False)
        pytest.skip(f"browser tests skipped: {missing}")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an asyncio loop running in this thread, and Django refuses
    # ORM calls while a loop runs; the test's own queries (and the database flush between
    # tests) are ordinary synchronous code, so allow them for this module.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                yield launched
            finally:
                launched.close()


@pytest.fixture
def page(browser: Browser, live_server: Any) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1600, "height": 1000}, locale="en-US")
    context.set_default_timeout(TIMEOUT_MS)
    opened = context.new_page()
    try:
        yield opened
    finally:
        context.close()


@pytest.fixture
def dialogs(page: Page) -> list[str]:
    """Every JavaScript dialog the page opens (none should): recorded, then dismissed."""
    seen: list[str] = []

    def record(dialog: Any) -> None:
        seen.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    page.on("dialog", record)
    return seen


# --- helpers -------------------------------------------------------------------------------


def make_user(username: str, codenames: list[str]) -> User:
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="django_inbox", codename__in=codenames
    )
    assert sorted(p.codename for p in perms) == sorted(codenames)
    user.user_permissions.set(perms)
    return user


def log_in(page: Page, base: str, username: str) -> None:
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")
    assert page.locator("#user-tools").inner_text().upper().startswith("WELCOME"), page.content()[
        :2000
    ]


def process_until(message_id: str, status: str, deadline: float = 60.0) -> InboxMessage:
    """Run ``process_due`` in this process until the row reaches ``status``."""
    stop = time.monotonic() + deadline
    while True:
        row = InboxMessage.objects.get(consumer="effects", message_id=message_id)
        if row.status == status:
            return row
        assert time.monotonic() < stop, f"{message_id} is {row.status}, not {status}"
        if not process_due(["effects"]).handled:
            time.sleep(0.05)  # the next attempt's backoff (0.01-0.05 s) has not passed yet


def make_messages() -> dict[str, InboxMessage]:
    """Completed, failed and dead messages, all through real delivery and processing."""
    for n in range(6):
        outcome = deliver(
            consumer="effects",
            message_id=f"order-{1000 + n}",
            event_type="effect.write",
            payload={"order": 1000 + n, "sku": f"SKU-{n}", "quantity": n + 1},
        )
        assert outcome == Outcome.PROCESSED
    for n in range(2):
        outcome = deliver(
            consumer="stream",
            message_id=f"tick-{n}",
            event_type="effect.write",
            payload={"tick": n},
        )
        assert outcome == Outcome.PROCESSED
    # Dead at once: the handler rejects them.
    for n in range(2):
        outcome = deliver(
            consumer="effects",
            message_id=f"unknown-sku-{n}",
            event_type="effect.write",
            payload={"order": 2000 + n, "reject": "sku unknown"},
        )
        assert outcome == Outcome.DEAD
    # Dead after three failed attempts, with markup in its payload.
    outcome = deliver(
        consumer="effects",
        message_id="always-fails",
        event_type="effect.write",
        payload={"fail_always": True, "note": XSS_NOTE},
    )
    assert outcome == Outcome.FAILED
    process_until("always-fails", Status.DEAD)
    # Dead after three attempts under a broken handler ("the warehouse API timed out"), which
    # is then fixed: the real handler is back, so a replay of this message succeeds.
    real = registry.get("effects", "effect.write")
    assert real is not None
    registry.unregister("effects", "effect.write")

    def broken(message: InboxMessage) -> None:
        Effect.objects.create(
            consumer="effects", message_id=message.message_id, attempt=message.attempts, pid=0
        )
        raise ConnectionError("warehouse API timed out after 30 s")

    try:
        with handler("effect.write", "effects", broken):
            outcome = deliver(
                consumer="effects",
                message_id="order-3001",
                event_type="effect.write",
                payload={"order": 3001, "sku": "SKU-42", "quantity": 2},
                source="orders-queue",
            )
            assert outcome == Outcome.FAILED
            process_until("order-3001", Status.DEAD)
    finally:
        registry.register(real)
    # Failed, waiting for their retry (on "stream", which the worker below leaves alone).
    for n in range(3):
        outcome = deliver(
            consumer="stream",
            message_id=f"flaky-{n}",
            event_type="effect.write",
            payload={"tick": 100 + n, "fail_times": 5},
        )
        assert outcome == Outcome.FAILED

    rows = {row.message_id: row for row in InboxMessage.objects.all()}
    statuses = Counter((row.consumer, row.status) for row in rows.values())
    assert statuses == {
        ("effects", Status.COMPLETED): 6,
        ("effects", Status.DEAD): 4,
        ("stream", Status.COMPLETED): 2,
        ("stream", Status.FAILED): 3,
    }
    assert rows["always-fails"].attempts == 3 and len(rows["always-fails"].errors) == 3
    assert rows["order-3001"].attempts == 3 and len(rows["order-3001"].errors) == 3
    assert effect_counts().get("order-3001", 0) == 0, "the failed attempts rolled back"
    return rows


def screenshot(page: Page, name: str) -> None:
    """A full-page PNG, written to ``docs/images/`` when missing or when asked to update
    (``INBOX_SCREENSHOTS=update``): they show the time of the run, so rewriting them on every
    run would change tracked files each time anybody runs the tests."""
    target = IMAGES / name
    png = page.screenshot(full_page=True)
    assert png.startswith(b"\x89PNG") and len(png) > 10_000, "an empty screenshot"
    if not target.exists() or os.environ.get("INBOX_SCREENSHOTS") == "update":
        IMAGES.mkdir(parents=True, exist_ok=True)
        target.write_bytes(png)


def status_of(page: Page) -> str:
    return page.locator(".field-status_display .readonly").inner_text().strip()


# --- tests ---------------------------------------------------------------------------------


def test_operator_finds_reads_and_replays_a_dead_message(
    page: Page, dialogs: list[str], live_server: Any, manage: Manage
) -> None:
    rows = make_messages()
    operator = make_user("operator", OPERATOR_PERMISSIONS)
    base = live_server.url
    log_in(page, base, "operator")

    # The changelist: the summary per consumer and status, and the problem banner.
    page.goto(f"{base}/admin/django_inbox/inboxmessage/")
    summary = page.locator("#inbox-summary")
    summary.wait_for()
    # Hide the app list (the admin remembers it), so the screenshots show the list whole.
    page.click("#toggle-nav-sidebar")
    page.locator("#nav-sidebar").wait_for(state="hidden")
    effects_row = summary.locator("tbody tr", has=page.locator("th", has_text="effects"))
    cells = [c.strip() for c in effects_row.locator("td").all_inner_texts()]
    # received, in progress, completed, failed, dead, parked, stuck, oldest due
    assert cells[:7] == ["0", "0", "6", "0", "4", "0", "0"], cells
    stream_row = summary.locator("tbody tr", has=page.locator("th", has_text="stream"))
    assert [c.strip() for c in stream_row.locator("td").all_inner_texts()][:6] == [
        "0",
        "0",
        "2",
        "3",
        "0",
        "0",
    ]
    banner = page.locator("#inbox-problems")
    assert banner.is_visible()
    banner_text = banner.inner_text()
    assert "1 problem needs attention" in banner_text, banner_text
    assert "effects" in banner_text and "4" in banner_text, banner_text
    assert page.locator("#result_list tbody tr").count() == len(rows)
    assert page.locator("#result_list .inbox-status-dead").count() == 4
    screenshot(page, "admin-changelist.png")

    # Filter by status dead through the filter sidebar.
    page.locator("#changelist-filter").get_by_role("link", name="dead", exact=True).click()
    page.wait_for_url(re.compile(r"status__exact=dead"))
    listed = page.locator("#result_list tbody tr")
    assert listed.count() == 4
    assert page.locator("#result_list .inbox-status-dead").count() == 4
    ids = set(page.locator("#result_list tbody th.field-message_id a").all_inner_texts())
    assert ids == {"unknown-sku-0", "unknown-sku-1", "always-fails", "order-3001"}

    # A dead message with markup in its payload: shown as text, never run.
    page.get_by_role("link", name="always-fails", exact=True).click()
    page.wait_for_url(re.compile(rf"/inboxmessage/{rows['always-fails'].pk}/change/"))
    assert status_of(page) == "✗ dead"
    payload = page.locator(".field-payload_display pre.inbox-json")
    assert '"note": "<script>alert(1)</script>"' in payload.inner_text()
    assert '"fail_always": true' in payload.inner_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in payload.inner_html()
    assert page.locator(".field-payload_display script").count() == 0
    timeline = page.locator("ol.inbox-timeline")
    text = timeline.inner_text()
    for attempt in (1, 2, 3):
        assert f"Attempt {attempt} failed" in text, text
    assert "RuntimeError: this message always fails" in text
    assert text.count("→ failed") == 2 and text.count("→ dead") == 1, text

    # The dead message whose handler has been fixed since: read it, then replay it.
    page.goto(f"{base}/admin/django_inbox/inboxmessage/{rows['order-3001'].pk}/change/")
    assert status_of(page) == "✗ dead"
    payload_text = page.locator(".field-payload_display pre.inbox-json").inner_text()
    assert '"sku": "SKU-42"' in payload_text
    text = page.locator("ol.inbox-timeline").inner_text()
    assert "Attempt 1 failed" in text and "Attempt 3 failed → dead" in text, text
    assert "ConnectionError: warehouse API timed out after 30 s" in text
    assert page.locator(".field-last_error").inner_text().count("ConnectionError") == 1
    buttons = sorted(page.locator("[id^=inbox-action-]").evaluate_all("els => els.map(e => e.id)"))
    assert buttons == [
        "inbox-action-park_messages",
        "inbox-action-replay_messages",
    ], "no force re-run: the operator lacks force_replay_inboxmessage"
    screenshot(page, "admin-detail.png")

    page.click("#inbox-action-replay_messages")
    reason = page.locator("#inbox-reason")
    reason.wait_for()
    assert page.locator("#inbox-eligible").inner_text().startswith("1 selected message can")
    assert page.locator("#inbox-selection tbody").inner_text().split() == ["✗", "dead", "1"]
    # It names the message, and once confirmed comes back to its page.
    assert page.locator("#inbox-sample").inner_text().split() == [
        "effects",
        "·",
        "order-3001",
        "✗",
        "dead",
    ]
    reason.fill("warehouse API is back (INC-4711)")
    page.set_viewport_size({"width": 1600, "height": 480})  # the page is short
    screenshot(page, "admin-confirm.png")
    page.click("#inbox-confirm")
    page.wait_for_url(re.compile(rf"/inboxmessage/{rows['order-3001'].pk}/change/$"))
    success = page.locator(".messagelist .success")
    success.wait_for()
    assert success.inner_text() == "Replayed 1 message(s) (1 dead)."
    replayed = InboxMessage.objects.get(pk=rows["order-3001"].pk)
    assert (replayed.status, replayed.attempts) == (Status.RECEIVED, 0)
    entry = replayed.history[-1]
    assert (entry["kind"], entry["via"], entry["from"], entry["attempts"]) == (
        "replay",
        "admin",
        "dead",
        3,
    )
    assert entry["reason"] == "warehouse API is back (INC-4711)"
    assert entry["by"] == f"operator (admin user {operator.pk})"
    log = LogEntry.objects.get(object_id=str(replayed.pk))
    assert log.user_id == operator.pk
    assert log.change_message == "Replayed (was dead). Reason: warehouse API is back (INC-4711)"
    others = InboxMessage.objects.exclude(pk=replayed.pk)
    assert all(row.status == rows[row.message_id].status for row in others), "only one changed"

    # A real worker processes it with the fixed handler.
    proc = manage("inbox_process", "--consumer", "effects", "--until-idle", "1")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "handled 1 (processed 1)" in out, out

    page.goto(f"{base}/admin/django_inbox/inboxmessage/{replayed.pk}/change/")
    assert status_of(page) == "✓ completed"
    text = page.locator("ol.inbox-timeline").inner_text()
    assert "Replayed by operator (admin user" in text, text
    assert "“warehouse API is back (INC-4711)”" in text
    assert "Completed on attempt 1" in text

    assert effect_counts()["order-3001"] == 1
    expected = {f"order-{1000 + n}" for n in range(6)} | {"order-3001"}
    assert lost_and_doubled(expected) == (0, 0)
    final = {row.message_id: row.status for row in InboxMessage.objects.all()}
    assert final["order-3001"] == Status.COMPLETED
    assert [final[m] for m in ("always-fails", "unknown-sku-0", "unknown-sku-1")] == ["dead"] * 3
    assert dialogs == [], "a page opened a JavaScript dialog"


def test_view_only_user_sees_no_action_and_no_payload(
    page: Page, dialogs: list[str], live_server: Any
) -> None:
    outcome = deliver(
        consumer="effects",
        message_id="secret-1",
        event_type="effect.write",
        payload={"customer_email": "jane@example.com", "reject": "sku unknown"},
    )
    assert outcome == Outcome.DEAD
    row = InboxMessage.objects.get(message_id="secret-1")
    make_user("viewer", ["view_inboxmessage"])
    base = live_server.url
    log_in(page, base, "viewer")

    page.goto(f"{base}/admin/django_inbox/inboxmessage/")
    page.locator("#inbox-summary").wait_for()
    assert page.locator("#inbox-problems").is_visible()
    assert page.locator("#result_list tbody tr").count() == 1
    assert page.locator("select[name=action]").count() == 0, "no action to choose"
    assert page.locator("#result_list input.action-select").count() == 0

    page.get_by_role("link", name="secret-1", exact=True).click()
    page.wait_for_url(re.compile(rf"/inboxmessage/{row.pk}/change/"))
    assert status_of(page) == "✗ dead"
    assert page.locator("[id^=inbox-action-]").count() == 0
    hidden = page.locator(".field-payload_hidden .inbox-hidden")
    assert hidden.inner_text().startswith("Hidden: payloads may hold personal data.")
    assert page.locator("pre.inbox-json").count() == 0
    assert "jane@example.com" not in page.content()
    # Error texts may quote the payload too: the viewer sees the failure's class and time only.
    timeline = page.locator("ol.inbox-timeline").inner_text()
    assert "Reject" in timeline and "sku unknown" not in page.content()
    assert "Hidden: error messages may quote the payload" in page.content()

    # A forged POST of the replay action, with a valid session and CSRF token, changes nothing.
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(
        f"{base}/admin/django_inbox/inboxmessage/",
        form={
            "csrfmiddlewaretoken": csrf,
            "action": "replay_messages",
            "_selected_action": str(row.pk),
            "index": "0",
            "confirm": "yes",
            "reason": "forged",
        },
        headers={"Referer": f"{base}/admin/django_inbox/inboxmessage/"},
    )
    assert response.ok, response.status
    assert "Replayed" not in response.text()  # the list again: it has no action to run
    after = InboxMessage.objects.get(pk=row.pk)
    assert (after.status, after.attempts, after.history) == (Status.DEAD, row.attempts, row.history)
    assert not LogEntry.objects.exists()
    assert dialogs == []


def test_operator_follows_a_key_and_skips_the_version_that_holds_it_back(
    page: Page, dialogs: list[str], live_server: Any
) -> None:
    """An ordered consumer: version 1 of a key is dead, version 2 waits for it. The operator
    finds the waiting message, follows its key, skips version 1 with a reason, and version 2
    runs."""
    from effects.models import OrderedRun

    def send(sequence: int, **payload: Any) -> Outcome:
        return deliver(
            consumer="ordered", message_id=f"case-7-v{sequence}", event_type="ordered.apply",
            payload=payload, key="CASE-7", sequence=sequence,
        )  # fmt: skip

    assert send(1, reject="bad data in v1") == Outcome.DEAD
    assert send(2) == Outcome.WAITING
    make_user("keeper", ["view_inboxmessage", "skip_inboxmessage", "view_payload_inboxmessage"])
    base = live_server.url
    log_in(page, base, "keeper")

    page.goto(f"{base}/admin/django_inbox/inboxmessage/")
    page.locator("#changelist-filter").get_by_role("link", name="waiting", exact=True).click()
    page.wait_for_url(re.compile(r"status__exact=waiting"))
    assert page.locator("#result_list tbody th.field-message_id a").all_inner_texts() == [
        "case-7-v2"
    ]
    page.get_by_role("link", name="case-7-v2", exact=True).click()
    ordering = page.locator(".field-ordering_display .readonly").inner_text()
    assert "no version of this key applied yet; this message waits for sequence 1" in ordering

    page.click("#inbox-key-link")
    page.locator("#inbox-key-versions").wait_for()
    rows = [r.split("\t") for r in page.locator("#inbox-key-versions tbody tr").all_inner_texts()]
    assert [(r[0], r[1], r[2].strip()) for r in rows] == [
        ("1", "case-7-v1", "✗ dead"),
        ("2", "case-7-v2", "… waiting"),
    ], rows
    page.get_by_role("link", name="case-7-v1", exact=True).click()
    assert status_of(page) == "✗ dead"
    page.click("#inbox-action-skip_versions")
    page.locator("#inbox-reason").fill("v1 cannot be applied (TICKET-9)")
    page.click("#inbox-confirm")
    page.wait_for_url(re.compile(r"/inboxmessage/\d+/change/$"))  # back on v1's page
    success = page.locator(".messagelist .success")
    success.wait_for()
    assert success.inner_text() == "Skipped 1 message(s) (1 dead)."

    assert process_due(["ordered"]).handled == 1
    page.goto(f"{base}/admin/django_inbox/inboxmessage/key/?consumer=ordered&key=CASE-7")
    rows = [r.split("\t") for r in page.locator("#inbox-key-versions tbody tr").all_inner_texts()]
    assert [r[2].strip() for r in rows] == ["↷ skipped", "✓ completed"], rows
    assert "sequence 2 applied" in page.locator("#inbox-key-applied").inner_text()
    assert list(OrderedRun.objects.values_list("sequence", flat=True)) == [2]
    skipped = InboxMessage.objects.get(message_id="case-7-v1")
    assert skipped.history[-1]["reason"] == "v1 cannot be applied (TICKET-9)"
    assert LogEntry.objects.get(object_id=str(skipped.pk)).change_message.startswith(
        "Skipped (was dead)"
    )
    assert dialogs == []


def test_the_first_screen_at_1400_px_shows_why_and_when(
    page: Page, dialogs: list[str], live_server: Any
) -> None:
    """At 1400 x 900, the list starts on the first screen and each row shows why it failed
    and when it is tried next, its UUID id on one line and its times with seconds and the
    zone; idle consumers are folded into one line; a parked message says who parked it."""
    make_messages()
    uuid_id = "3f2b8c1e-9a4d-4c7e-b1f0-5d6e7a8b9c0d"
    assert (
        deliver(
            consumer="effects",
            message_id=uuid_id,
            event_type="effect.write",
            payload={"order": 4001, "reject": "sku unknown"},
        )
        == Outcome.DEAD
    )
    parked = InboxMessage.objects.get(message_id="unknown-sku-1")
    from django_inbox.services import operator as operator_actions

    operator_actions.park(
        InboxMessage.objects.filter(pk=parked.pk), actor="ana (on call)", reason="INC-4711"
    )
    assert InboxMessage.objects.get(pk=parked.pk).status == Status.PARKED
    make_user("operator", OPERATOR_PERMISSIONS)
    base = live_server.url
    page.set_viewport_size({"width": 1400, "height": 900})
    log_in(page, base, "operator")
    page.goto(f"{base}/admin/django_inbox/inboxmessage/")
    page.locator("#inbox-summary").wait_for()
    page.click("#toggle-nav-sidebar")
    page.locator("#nav-sidebar").wait_for(state="hidden")

    # Idle consumers (audit and the others with nothing to do) fold into one line.
    shown = page.locator("#inbox-summary tbody th").all_inner_texts()
    assert shown == ["effects", "stream"], shown
    assert "audit" in page.locator("#inbox-quiet").inner_text()
    assert (
        "effects: 1 parked, waiting for an operator" in page.locator("#inbox-notices").inner_text()
    )

    first = page.locator("#result_list tbody tr").first
    cause = first.locator("td.field-short_error")
    # No sideways scrolling of the list, and the cause and next attempt on the first screen.
    results = page.locator("#changelist .results")
    overflow = results.evaluate("el => el.scrollWidth - el.clientWidth")
    widths = page.locator("#result_list thead th").evaluate_all(
        "els => els.map(e => [e.className, Math.round(e.getBoundingClientRect().width)])"
    )
    assert overflow <= 0, f"the list scrolls sideways by {overflow} px at 1400 px: {widths}"
    for cell in (cause, first.locator("td.field-next_attempt_display")):
        box = cell.bounding_box()
        assert box is not None
        assert box["x"] + box["width"] <= 1400 and box["y"] + box["height"] <= 900, box
    # The newest row is the UUID dead one: its id on one line, like the consumer beside it.
    id_cell = first.locator("th.field-message_id")
    assert id_cell.inner_text().strip() == uuid_id
    consumer_cell = first.locator("td.field-consumer").bounding_box()
    id_box = id_cell.bounding_box()
    assert id_box is not None and consumer_cell is not None
    assert id_box["height"] <= consumer_cell["height"] + 2, (id_box, consumer_cell)
    assert cause.inner_text().strip() == "Reject: sku unknown"
    stamp = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
    failing = page.locator("#result_list tbody tr", has=page.locator("th", has_text="flaky-0"))
    from django_inbox.conf import inbox_settings

    limit = inbox_settings.policy("stream").max_attempts
    assert failing.locator("td.field-attempts_display").inner_text().strip() == f"1 of {limit}"
    assert stamp.fullmatch(failing.locator("td.field-next_attempt_display").inner_text().strip())
    assert first.locator("td.field-next_attempt_display").inner_text().strip() == "-"
    screenshot(page, "admin-first-screen.png")

    # The parked message: who parked it and why; its attempts out of the maximum.
    page.goto(f"{base}/admin/django_inbox/inboxmessage/{parked.pk}/change/")
    parked_line = page.locator(".field-parked_display .readonly").inner_text()
    assert parked_line == "an operator, ana (on call) via python: “INC-4711”", parked_line
    assert (
        page.locator(".fieldBox.field-attempts_display .readonly").inner_text().strip() == "1 of 3"
    )
    assert stamp.fullmatch(
        page.locator(".fieldBox.field-received_display .readonly").inner_text().strip()
    )
    buttons = page.locator("[id^=inbox-action-]").evaluate_all("els => els.map(e => e.id)")
    assert "inbox-action-skip_versions" not in buttons  # not an ordered consumer
    screenshot(page, "admin-parked.png")
    assert dialogs == []


def test_the_outbox_admin_shows_badges_destinations_and_a_timeline(
    page: Page, dialogs: list[str], live_server: Any
) -> None:
    from django.utils import timezone

    from django_inbox.outbox import publish
    from django_inbox.outbox.models import OutboxMessage

    cause = InboxMessage.objects.create(
        consumer="effects", message_id="order-77", event_type="order.paid", payload={}
    )
    ids = [
        publish("order.placed", {"n": n}, routing_key="orders", key="order-77") for n in range(2)
    ]
    sent = publish("order.paid", {"n": 9}, routing_key="billing", exchange="shop")
    dead = publish("order.refunded", {"n": 8}, routing_key="nowhere")
    OutboxMessage.objects.filter(message_id=sent).update(
        status="sent",
        attempts=2,
        sent_at=timezone.now(),
        last_error="unroutable: no queue bound",
        causation_consumer="effects",
        causation_message_id="order-77",
    )
    OutboxMessage.objects.filter(message_id=dead).update(
        status="dead", attempts=10, last_error="unroutable: no queue bound to nowhere"
    )
    assert all(ids)
    user = User.objects.create_user("ops", password=PASSWORD, is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_outboxmessage", "view_inboxmessage"])
    )
    base = live_server.url
    page.set_viewport_size({"width": 1400, "height": 900})
    log_in(page, base, "ops")
    page.goto(f"{base}/admin/django_inbox_outbox/outboxmessage/")
    page.locator("#outbox-summary").wait_for()
    page.click("#toggle-nav-sidebar")
    page.locator("#nav-sidebar").wait_for(state="hidden")
    banner = page.locator("#outbox-problems").inner_text()
    assert "1 outbox message dead" in banner, banner
    assert page.locator("#result_list .inbox-status-dead").inner_text().strip() == "✗ dead"
    assert page.locator("#result_list .inbox-status-sent").count() == 1
    destinations = page.locator("#result_list td.field-destination_display").all_inner_texts()
    assert "shop → billing" in destinations and "(default exchange) → orders" in destinations
    screenshot(page, "admin-outbox.png")

    row = OutboxMessage.objects.get(message_id=sent)
    page.goto(f"{base}/admin/django_inbox_outbox/outboxmessage/{row.pk}/change/")
    timeline = page.locator("ol.inbox-timeline").inner_text()
    assert "Written to shop → billing" in timeline and "Sent on attempt 2" in timeline
    page.get_by_role("link", name="effects · order-77").click()
    page.wait_for_url(re.compile(rf"/inboxmessage/{cause.pk}/change/"))
    assert dialogs == []
