from django.urls import path

from gpuadmin.notify import views

urlpatterns = [
    path("", views.preferences, name="notification_preferences"),
]
