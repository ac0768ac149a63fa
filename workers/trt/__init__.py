"""The TensorRT backend (onnxruntime-gpu's TensorRT EP), building for the GPU it runs on: runner,
ep_options, and child (the compile/load process, the only module here that imports onnxruntime).
May import workers.runner, workers.epcontext, workers.childproc and farm.core; never workers.backends."""
