from django.urls import path

from gpuadmin.fairuse import views

urlpatterns = [
    path("me/gpus/", views.my_gpus, name="my_gpus"),
    path("me/gpus/stop/", views.stop_mine, name="stop_mine"),
    path("me/gpus/nudge/", views.nudge, name="nudge"),
    path("fair-use/cases/<int:case_id>/", views.case_detail, name="fair_use_case"),
    path("fair-use/policies/<int:policy_id>/", views.policy_detail, name="fair_use_policy"),
]
