"""The contract between `export/` (which writes graphs) and `service/` (which runs them): the
manifest of an export dir. No torch, no ONNX Runtime."""
