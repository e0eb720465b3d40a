"""Helpers shared by the test tiers (not collected: no ``test_`` modules here)."""
