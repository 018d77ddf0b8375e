"""Reads shaped for the console's pages."""
