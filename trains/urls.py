from django.urls import path

from trains.views import emergency, trains_pages

app_name = "trains"
urlpatterns = [
    path("", trains_pages.trains_list, name="list"),
    path("upgrades/", trains_pages.upgrades_list, name="upgrades"),
    path("emergency/new/", emergency.emergency_train_new, name="emergency-new"),
]
