"""The contract between `export/` (which writes graphs) and `service/` (which runs them): the
graphs' inputs and outputs and the manifest of an export dir. No torch, no ONNX Runtime."""
