from django.urls import path

from trains.views import emergency, train_forms, trains_pages

app_name = "trains"
urlpatterns = [
    path("", trains_pages.trains_list, name="list"),
    path("new/", train_forms.train_new, name="train-new"),
    path("<int:pk>/", trains_pages.train_detail, name="detail"),
    path("<int:pk>/edit/", train_forms.train_edit, name="train-edit"),
    path("<int:pk>/pause/", trains_pages.train_pause_view, name="pause"),
    path("<int:pk>/resume/", trains_pages.train_resume_view, name="resume"),
    path("upgrades/", trains_pages.upgrades_list, name="upgrades"),
    path("upgrades/new/", train_forms.upgrade_new, name="upgrade-new"),
    path("upgrades/<int:pk>/", trains_pages.upgrade_detail, name="upgrade-detail"),
    path("upgrades/<int:pk>/replan/", train_forms.upgrade_replan_view, name="upgrade-replan"),
    path("upgrades/<int:pk>/offboard/", train_forms.upgrade_offboard_view, name="upgrade-offboard"),
    path("upgrades/<int:pk>/reonboard/", trains_pages.upgrade_reonboard_view, name="upgrade-reonboard"),
    path("emergency/new/", emergency.emergency_train_new, name="emergency-new"),
]
