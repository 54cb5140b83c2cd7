"""Helpers shared by several task families (never imported sideways between families)."""
