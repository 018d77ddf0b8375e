from django.apps import AppConfig


class TrainsConfig(AppConfig):
    name = "trains"
    verbose_name = "Maintenance trains"
