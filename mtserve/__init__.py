"""The `mtserve` command and the tools that need both sides: evaluation and verification of an
export against PyTorch. `export/` and `service/` never import each other; this package does both."""
