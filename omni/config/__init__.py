"""Pipeline configuration: schema (pipeline.py), checks, memory budgets, presets/."""
