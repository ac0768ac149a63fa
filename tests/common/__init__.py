"""Fakes and builders shared by unit and integration tests."""
