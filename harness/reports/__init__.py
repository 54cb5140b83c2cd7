"""Everything rendered from stored results: tables, reports, paper comparisons,
extrapolation, attention analysis and the efficiency benchmark."""
