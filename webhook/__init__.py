"""Webhook."""
