"""Thin HTTP routes: parse, call the speech service, map the result."""
