"""The runtimes a worker runs a model on: ONNX Runtime and TorchScript on the CPU, CUDA on a
GPU (with its CPU fallback and NVML), and how a graph is picked."""
