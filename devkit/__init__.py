"""Test scaffolding that tests/ and benchmarks/ import: the server launcher, HTTP clients, load,
and helpers more than one test module needs. Not installed (pyproject.toml packages only
`ringserve`), and imported by nothing under ringserve."""
