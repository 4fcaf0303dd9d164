"""The signed-in user's own settings: how they are told of their jobs (/account/notifications/), and signing out
everywhere (/account/sign-out-everywhere/)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from quotas.sign_out import user_sign_out_everywhere
from scheduling.errors import ServiceError
from scheduling.notifications.services import notification_settings_save, settings_of

JOB_EVENT_CHOICES = [("start", "starts"), ("end", "ends"), ("fail", "fails"), ("preempt", "is preempted")]
ADMIN_EVENT_CHOICES = [("node_lost", "a node is lost"), ("gpu_xid", "a GPU reports an XID error")]


class NotificationForm(forms.Form):
    job_events = forms.MultipleChoiceField(
        required=False,
        label="Tell me when a job of mine",
        choices=JOB_EVENT_CHOICES,
        widget=forms.CheckboxSelectMultiple,
        help_text="For jobs that say nothing themselves (tessera submit --notify, the submit form's boxes).",
    )
    email = forms.BooleanField(required=False, label="By email")
    webhook_url = forms.CharField(
        required=False,
        max_length=500,
        label="And to this webhook",
        help_text="A Slack-compatible incoming webhook URL (https)",
    )
    admin_events = forms.MultipleChoiceField(
        required=False,
        label="Staff: tell me when",
        choices=ADMIN_EVENT_CHOICES,
        widget=forms.CheckboxSelectMultiple,
    )


def _without_an_address(form: NotificationForm) -> None:
    """No email can go to an account with no address: the box is shown unticked and cannot be ticked (it read
    "By email" ticked beside "your account's address, which is not set")."""
    field = form.fields["email"]
    field.disabled = True
    field.initial = form.initial["email"] = False
    field.help_text = "Your account has no email address: ask an admin to set one."


@login_required
def notifications(request: HttpRequest) -> HttpResponse:
    prefs = settings_of(request.user)
    has_address = bool(request.user.email)
    if request.method == "POST":
        form = NotificationForm(request.POST)
        if not has_address:
            _without_an_address(form)
        if form.is_valid():
            d = form.cleaned_data
            try:
                notification_settings_save(
                    user=request.user,
                    job_events=d["job_events"],
                    # Without an address the stored choice stands, for when an admin sets one.
                    email=d["email"] if has_address else prefs.email,
                    webhook_url=d["webhook_url"],
                    admin_events=d["admin_events"] if request.user.is_staff else None,
                )
            except ServiceError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            else:
                messages.success(request, "Notification settings saved.")
                return redirect("frontend:notifications")
    else:
        form = NotificationForm(
            initial={
                "job_events": prefs.job_events,
                "email": prefs.email,
                "webhook_url": prefs.webhook_url,
                "admin_events": prefs.admin_events,
            }
        )
        if not has_address:
            _without_an_address(form)
    if not request.user.is_staff:
        del form.fields["admin_events"]
    return render(
        request, "frontend/account/notifications.html", {"form": form, "email_address": request.user.email}
    )


@login_required
def sign_out_everywhere(request: HttpRequest) -> HttpResponse:
    """GET asks first; POST ends every session of the user (this one too) and revokes every token of theirs."""
    if request.method != "POST":
        return render(request, "frontend/account/sign_out_everywhere.html")
    done = user_sign_out_everywhere(user=request.user, why="asked on the account page")
    logout(request)
    messages.success(
        request,
        f"Signed out everywhere: {done.sessions_ended} session(s) ended, {done.tokens_revoked} token(s) revoked.",
    )
    return redirect("frontend:login")
