"""The REST API: thin viewsets over the same services and selectors as the UI."""
