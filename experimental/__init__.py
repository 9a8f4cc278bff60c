"""Experimental adapters."""
