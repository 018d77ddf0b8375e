from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from opsplanner import views

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.health_web, name="health-web"),
    path("healthz/workers", views.health_workers, name="health-workers"),
    path("login/", auth_views.LoginView.as_view(template_name="registration/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("fleet/", include("fleet.urls")),
    path("api/", include("opsplanner.api.urls")),
    path("admin/", admin.site.urls),
]
