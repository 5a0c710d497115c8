"""Tests for yxanul.evaluation."""
