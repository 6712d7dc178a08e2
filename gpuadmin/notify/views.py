"""The notification preferences page: each person chooses where and what they hear about."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from gpuadmin.accounts.permissions import role_required
from gpuadmin.accounts.roles import Role
from gpuadmin.notify.delivery import destination_problem, shown_url
from gpuadmin.notify.models import Person


class PreferencesForm(forms.ModelForm):
    class Meta:
        model = Person
        fields = ["email", "notification_urls", "notify_requests_to_approve", "notify_my_requests",
                  "notify_my_processes"]
        widgets = {"notification_urls": forms.Textarea(attrs={"rows": 3, "cols": 70})}

    def clean_notification_urls(self) -> str:
        urls = [line.strip() for line in self.cleaned_data["notification_urls"].splitlines() if line.strip()]
        for url in urls:
            if "not a URL Apprise understands" in shown_url(url):
                raise forms.ValidationError(f"Not a notification URL Apprise understands: {shown_url(url)}")
            if problem := destination_problem(url):
                raise forms.ValidationError(f"{shown_url(url)}: {problem}")
        return "\n".join(urls)


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def preferences(request: HttpRequest) -> HttpResponse:
    user = request.user
    assert isinstance(user, User)  # role_required let only a signed-in person through
    person = Person.objects.filter(user=user).first() or Person(
        user=user, name=user.get_full_name() or user.get_username(), email=user.email
    )
    form = PreferencesForm(request.POST or None, instance=person)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, "Notification preferences saved.")
        return redirect("notification_preferences")
    return render(request, "notify/preferences.html", {"form": form, "person": person},
                  status=400 if request.method == "POST" else 200)
