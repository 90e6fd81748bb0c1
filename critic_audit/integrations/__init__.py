"""Integrations with training engines (optional extras). Each subpackage imports its engine."""
