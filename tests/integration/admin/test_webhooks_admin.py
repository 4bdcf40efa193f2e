"""Webhooks in the admin: endpoints without their secret, the delivery log with every try, and
"redeliver" (change permission only)."""

import pytest
from django.urls import reverse

from jobqueue import lifecycle, states
from jobqueue.maintenance import webhooks
from jobqueue.models import WebhookAttempt, WebhookDelivery
from tests.factories import claimed_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def failed_delivery():
    job, grant = claimed_job(dispatch_context={"token": "hunter2-admin-hook"})
    endpoint, secret = webhooks.create_endpoint(job.workspace_id, "http://127.0.0.1:9/hook")
    lifecycle.report_status(job.id, grant.claim_id, states.FAILURE)
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(id=delivery.id).update(
        status="failed", attempts=2, last_status_code=503, last_error="answered 503")
    for n in (1, 2):
        WebhookAttempt.objects.create(delivery=delivery, number=n, duration_seconds=0.25,
                                      status_code=503, error="answered 503")
    return endpoint, secret, delivery


def test_the_endpoint_pages_never_show_the_secret(op_client, failed_delivery):
    endpoint, secret, _ = failed_delivery
    listing = op_client.get(reverse("admin:jobqueue_webhookendpoint_changelist"))
    page = op_client.get(reverse("admin:jobqueue_webhookendpoint_change", args=[endpoint.id]))
    assert listing.status_code == page.status_code == 200
    assert "127.0.0.1:9/hook" in page.content.decode()
    assert secret not in listing.content.decode() + page.content.decode()
    assert op_client.get(reverse("admin:jobqueue_webhookendpoint_add")).status_code == 403


def test_the_delivery_log_shows_every_try(op_client, failed_delivery):
    _, _, delivery = failed_delivery
    page = op_client.get(reverse("admin:jobqueue_webhookdelivery_change", args=[delivery.id]))
    html = page.content.decode()
    assert page.status_code == 200
    assert html.count("answered 503") >= 3 and "0.25" in html
    assert "hunter2-admin-hook" not in html


def test_redeliver_needs_the_change_permission(op_client, viewer, failed_delivery):
    from django.test import Client

    _, _, delivery = failed_delivery
    url = reverse("admin:jobqueue_webhookdelivery_changelist")
    staff = Client()
    staff.force_login(viewer)
    r = staff.post(url, {"action": "redeliver", "_selected_action": [str(delivery.id)]})
    assert r.status_code in (200, 403) and "will be sent again" not in r.content.decode()
    assert WebhookDelivery.objects.get().status == "failed"  # unchanged
    r = op_client.post(url, {"action": "redeliver", "_selected_action": [str(delivery.id)]},
                       follow=True)
    assert "1 delivery(ies) will be sent again." in r.content.decode()
    d = WebhookDelivery.objects.get()
    assert (d.status, d.attempts) == ("pending", 0)
    assert WebhookAttempt.objects.count() == 2  # the log stays


def test_the_admin_says_webhook_deliveries(op_client):
    from django.apps import apps

    index = op_client.get(reverse("admin:index")).content.decode()
    assert "Webhook deliveries" in index and "deliverys" not in index.lower()
    # And no model of ours has Django's naive plural of a word in consonant + y ("keys" is
    # right: "fairness keys").
    for model in apps.get_app_config("jobqueue").get_models():
        plural = str(model._meta.verbose_name_plural)
        assert not (plural.endswith("ys") and plural[-3:-2] not in "aeiou"), model


def test_the_delivery_page_shows_the_body_as_sent_with_agent_text_redacted(op_client):
    job, grant = claimed_job(dispatch_context={"token": "hunter2-admin-hook"})
    webhooks.create_endpoint(job.workspace_id, "http://127.0.0.1:9/hook")
    lifecycle.report_status(job.id, grant.claim_id, states.FAILURE,
                            message="echoed hunter2-admin-hook", result={"t": "hunter2-admin-hook"})
    delivery = WebhookDelivery.objects.get()
    html = op_client.get(reverse("admin:jobqueue_webhookdelivery_change",
                                 args=[delivery.id])).content.decode()
    assert "hunter2-admin-hook" not in html
    assert "echoed [redacted]" in html and "&quot;t&quot;: &quot;[redacted]&quot;" in html


def test_a_delivery_written_before_bodies_were_fixed_says_so(op_client, failed_delivery):
    _, _, delivery = failed_delivery
    WebhookDelivery.objects.filter(id=delivery.id).update(payload=None)
    html = op_client.get(reverse("admin:jobqueue_webhookdelivery_change",
                                 args=[delivery.id])).content.decode()
    assert "— (fixed at its first try)" in html
