"""TensorRT backend via onnxruntime-gpu's TensorRT EP. Builds for the GPU it runs on."""
