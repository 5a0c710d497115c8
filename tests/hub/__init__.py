"""Tests for yxanul.hub."""
