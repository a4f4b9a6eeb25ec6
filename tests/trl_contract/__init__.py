"""What the package relies on in TRL's internals, one test per reliance: run against a new TRL release, the failures
list exactly what moved (README, "A new TRL")."""
