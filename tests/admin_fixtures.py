"""Users and clients for the admin tests (imported by the test_admin_* modules)."""

from __future__ import annotations

import itertools

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

_names = itertools.count(1)


@pytest.fixture
def make_user(django_user_model):
    """Make a user with the given django_jobs permissions (codenames); staff unless told."""

    def make(*codenames, staff=True, superuser=False):
        user = django_user_model.objects.create_user(
            f"user{next(_names)}", is_staff=staff, is_superuser=superuser
        )
        if codenames:
            perms = list(
                Permission.objects.filter(
                    content_type__app_label="django_jobs", codename__in=codenames
                )
            )
            assert len(perms) == len(codenames), f"unknown permission among {codenames}"
            user.user_permissions.set(perms)
        return user

    return make


@pytest.fixture
def login(make_user):
    """Return a logged-in test client for a new user with these permissions."""

    def client_for(*codenames, superuser=False, staff=True, enforce_csrf_checks=False):
        client = Client(enforce_csrf_checks=enforce_csrf_checks)
        client.force_login(make_user(*codenames, superuser=superuser, staff=staff))
        return client

    return client_for


@pytest.fixture
def admin_client_(login):
    return login(superuser=True)


def url(name, *args):
    return reverse(f"admin:django_jobs_{name}", args=args)


def messages_of(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def action(client, model, name, ids, **extra):
    """POST a change-list action as the browser does."""
    data = {"action": name, "_selected_action": [str(i) for i in ids], **extra}
    return client.post(url(f"{model}_changelist"), data, follow=True)


def action_names(response):
    """The actions offered on a change-list page."""
    form = response.context["action_form"]
    if form is None:  # no action at all: the page has no action form
        return []
    return [value for value, _label in form.fields["action"].choices if value]


VIEW_ONLY = ("view_deadletter", "view_job", "view_completionmarker")
