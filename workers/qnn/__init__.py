"""QNN (Qualcomm AI Engine Direct) backend via the onnxruntime-qnn plugin EP."""
