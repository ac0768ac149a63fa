"""The QNN backend (Qualcomm AI Engine Direct, via the onnxruntime-qnn plugin EP): runner (parent side)
and child (the compile/load process, the only module here that imports onnxruntime).
May import workers.runner, workers.host, workers.epcontext, workers.childproc and farm.core; never workers.backends."""
