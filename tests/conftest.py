"""Shared test settings. (Tests find the repository root as ``Path(__file__).parents[N]``:
importing this module by name would be ambiguous, since test folders have conftest files of
their own.)"""
