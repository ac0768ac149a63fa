"""The QNN backend (Qualcomm AI Engine Direct, via the onnxruntime-qnn plugin EP): runner and accuracy (parent
side), child and accuracy_child (the processes they start: the only modules here that import onnxruntime).
May import workers.runner, workers.host, workers.epcontext, workers.childproc and farm.core; never workers.backends."""
