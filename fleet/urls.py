from django.urls import path

from fleet import views

app_name = "fleet"
urlpatterns = [
    path("pools/<str:name>/", views.pool_hosts, name="pool-hosts"),
]
