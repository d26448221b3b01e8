"""mtserve's serving path: ONNX Runtime, gRPC, batching. Nothing here imports torch."""
