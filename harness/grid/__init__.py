"""The grid: method specs, the runner that trains cells, and the result store."""
