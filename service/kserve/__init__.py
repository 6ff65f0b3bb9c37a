"""KServe v2 / Open Inference Protocol semantics that neither transport owns."""
